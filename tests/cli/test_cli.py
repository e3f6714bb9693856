"""tuner.cli: `python -m tuner ...` in a subprocess, as a user runs it: one error line, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from tests.conftest import REPO_ROOT, fast_dir, require_family, toy_space_text
from tests.fakes.fake_compile import fake_compiler
from tests.fakes.fake_measure import FakeMeasure
from tuner._version import __version__
from tuner.devices import limits_for_arch
from tuner.problem import Problem
from tuner.run import TuneSettings, tune
from tuner.search import make_sampler, make_search
from tuner.space import available_families, load_space
from tuner.study import _meta as st
from tuner.study import open_storage

HAS_GPU = Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists()
HAS_GP_DEPS = all(__import__("importlib").util.find_spec(m) for m in ("torch", "scipy"))


def flashtune(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def assert_one_error_line(proc: subprocess.CompletedProcess, command: str, *fragments: str) -> str:
    assert proc.returncode != 0, proc
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"flashtune {command}: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.fixture
def family() -> str:
    """A family that exists (sm80, the CLI's default, when it is there)."""
    families = available_families()
    if not families:
        pytest.skip("no kernel family yet")
    return "sm80" if "sm80" in families else families[0]


@pytest.fixture(scope="module")
def fake_db():
    """A storage holding one study made with the fake compiler and GPU, named as the failing commands will ask."""
    with fast_dir() as directory:
        (directory / "toy.toml").write_text(toy_space_text())
        space = load_space(directory / "toy.toml")
        problem = Problem(batch=8, seqlen_q=2048, heads_q=16, head_dim=128)
        url = f"sqlite:///{directory}/studies.db"
        study = st.open_study(
            storage=open_storage(url),
            name="kept",
            space=space,
            problem=problem,
            gpu={"name": "Fake GPU", "arch": 80},
            sampler=make_sampler("random", space, 0),
        )
        tune(
            study,
            space,
            problem,
            limits_for_arch(80),
            FakeMeasure(),
            TuneSettings(n_trials=4, compile_workers=1),
            compiler=fake_compiler,
            search=make_search("random", space, problem, limits_for_arch(80), 0),
        )
        yield url


def _state(url: str):
    storage = open_storage(url)
    out = {}
    for summary in optuna.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        out[summary.study_name] = (
            study.user_attrs,
            [(t.number, t.state, t.params, t.values, t.user_attrs, t.datetime_complete) for t in study.get_trials()],
        )
    return out


# ---- failures: one line on stderr, non-zero, nothing changed ------------------------------------------------


def test_unknown_family(tmp_path):
    assert_one_error_line(flashtune("tune", "--family", "nope", cwd=tmp_path), "tune", "unknown kernel family 'nope'")


def test_unsupported_head_dim(tmp_path, family):
    assert_one_error_line(flashtune("tune", "--family", family, "--head-dim", "96", cwd=tmp_path), "tune", "96")


def test_kv_heads_not_dividing(tmp_path, family):
    proc = flashtune("tune", "--family", family, "--heads", "16", "--kv-heads", "5", cwd=tmp_path)
    assert_one_error_line(proc, "tune", "heads_kv (5)", "heads_q (16)")


@pytest.mark.parametrize(("option", "field"), [("--seqlen", "seqlen_q"), ("--batch", "batch"), ("--heads", "heads_q")])
def test_zero_size(tmp_path, family, option, field):
    assert_one_error_line(flashtune("tune", "--family", family, option, "0", cwd=tmp_path), "tune", field)


def test_bad_dtype(tmp_path, family):
    assert_one_error_line(flashtune("tune", "--family", family, "--dtype", "fp8", cwd=tmp_path), "tune", "fp8")


def test_non_positive_trials(tmp_path, family):
    assert_one_error_line(flashtune("tune", "--family", family, "--trials", "0", cwd=tmp_path), "tune", "--trials")


@pytest.mark.parametrize(
    ("option", "value", "fragment"),
    [
        ("--compile-workers", "0", "--compile-workers must be at least 1, not 0"),
        ("--rounds", "0", "--rounds must be at least 1, not 0"),
        ("--top-k", "-1", "--top-k must be at least 0, not -1"),
        ("--timeout", "0", "--timeout must be from 1 to 1e+07 seconds, not 0"),
        ("--trial-timeout", "-5", "--trial-timeout must be from 1 to 1e+07 seconds, not -5"),
    ],
)
def test_run_options_out_of_range_are_refused_before_any_gpu_work(tmp_path, family, option, value, fragment):
    proc = flashtune("tune", "--family", family, option, value, cwd=tmp_path)
    assert_one_error_line(proc, "tune", fragment)
    assert not (tmp_path / "studies").exists()


def test_bad_storage_url(tmp_path, family):
    proc = flashtune("tune", "--family", family, "--storage", "not a url", cwd=tmp_path)
    assert_one_error_line(proc, "tune", "invalid storage URL")
    assert not (tmp_path / "studies").exists()


def test_storage_password_is_masked(tmp_path, family):
    pytest.importorskip("psycopg")
    proc = flashtune(
        "tune", "--family", family, "--storage", "postgresql+psycopg://me:pa55word@127.0.0.1:1/db", cwd=tmp_path
    )
    line = assert_one_error_line(proc, "tune", "cannot open storage")
    assert "pa55word" not in proc.stderr + proc.stdout and "***" in line


def test_storage_of_another_program(tmp_path, family):
    import sqlite3

    db = tmp_path / "app.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE users (id INTEGER)")
    conn.close()
    before = db.read_bytes()
    for args in (("tune", "--family", family), ("studies",), ("best", "--study", "x")):
        proc = flashtune(*args, "--storage", f"sqlite:///{db}", cwd=tmp_path)
        assert_one_error_line(proc, args[0], "another program")
    assert db.read_bytes() == before


@pytest.mark.skipif(HAS_GP_DEPS, reason="the gp sampler's dependencies are installed")
def test_gp_sampler_without_torch(tmp_path, family):
    assert_one_error_line(flashtune("tune", "--family", family, "--sampler", "gp", cwd=tmp_path), "tune", "PyTorch")


def test_best_of_a_missing_study(tmp_path, fake_db):
    proc = flashtune("best", "--study", "absent", "--storage", fake_db, cwd=tmp_path)
    assert_one_error_line(proc, "best", "no study named 'absent'")


def test_studies_on_an_empty_storage(tmp_path):
    open_storage(f"sqlite:///{tmp_path}/empty.db")  # a study database with no study in it
    proc = flashtune("studies", "--storage", f"sqlite:///{tmp_path}/empty.db", cwd=tmp_path)
    assert_one_error_line(proc, "studies", "no flashtune studies")
    assert proc.stdout == ""


def test_studies_where_no_database_exists_creates_none(tmp_path):
    proc = flashtune("studies", "--storage", f"sqlite:///{tmp_path}/missing.db", cwd=tmp_path)
    assert_one_error_line(proc, "studies", "no study database", "flashtune tune")
    assert not (tmp_path / "missing.db").exists()


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_tune_without_a_gpu(tmp_path, family):
    proc = flashtune(
        "tune", "--family", family, "--trials", "2", "--storage", f"sqlite:///{tmp_path}/s.db", cwd=tmp_path
    )
    assert_one_error_line(proc, "tune", "no usable GPU 0", "flashtune check")
    if (tmp_path / "s.db").exists():  # nothing was created in it
        assert not optuna.get_all_study_summaries(open_storage(f"sqlite:///{tmp_path}/s.db"))


def test_failed_commands_change_no_stored_study(tmp_path, family, fake_db):
    before = _state(fake_db)
    assert list(before) == ["kept"] and len(before["kept"][1]) >= 4
    failing = [
        ("tune", "--family", family, "--study", "kept", "--seqlen", "0"),
        ("tune", "--family", family, "--study", "kept", "--head-dim", "96"),
        ("tune", "--family", family, "--study", "kept", "--kv-heads", "3"),
        ("tune", "--family", "nope", "--study", "kept"),
        ("best", "--study", "absent"),
    ]
    if not HAS_GPU:
        failing.append(("tune", "--family", family, "--study", "kept", "--trials", "100"))
    for args in failing:
        proc = flashtune(*args, "--storage", fake_db, cwd=tmp_path)
        assert_one_error_line(proc, args[0])
    assert _state(fake_db) == before


# ---- successes ----------------------------------------------------------------------------------------------


def test_version(tmp_path):
    proc = flashtune("--version", cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"flashtune {__version__}"


def test_best_and_studies_of_a_stored_study(tmp_path, fake_db):
    from tests.fake_studies import make_study

    url = f"sqlite:///{tmp_path}/real.db"
    make_study(url, "kept", winner=False)
    knobs = {k.name for k in load_space("sm80" if "sm80" in available_families() else available_families()[0]).knobs}
    proc = flashtune("best", "--study", "kept", "--storage", url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("best of kept (best trial): ")
    assert "TFLOPS" in proc.stdout and all(f"  {k} = " in proc.stdout for k in knobs)

    proc = flashtune("best", "--study", "kept", "--storage", url, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    best = json.loads(proc.stdout)
    assert best["study"] == "kept" and best["source"] == "best trial"
    assert set(best["config"]) == knobs

    # best serves what export serves: a study of a family whose space file is not there is refused
    proc = flashtune("best", "--study", "kept", "--storage", fake_db, cwd=tmp_path)
    assert_one_error_line(proc, "best", "family 'toy', which cannot be loaded")

    proc = flashtune("studies", "--storage", fake_db, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [header, row] = proc.stdout.splitlines()
    assert header.startswith("study") and row.startswith("kept") and row.endswith("Fake GPU")


def test_check_one_sample(tmp_path):
    require_family("sm80")
    proc = flashtune("check", "--family", "sm80", "--samples", "1", "--jobs", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "check passed" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_check_of_sm90_builds_for_sm_90a_unless_told_an_older_arch(tmp_path):
    require_family("sm90")
    proc = flashtune("check", "--family", "sm90", "--head-dim", "64", "--samples", "1", "--jobs", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("sm90 on sm_90a ") and "check passed" in proc.stdout
    proc = flashtune("check", "--family", "sm90", "--arch", "80", "--samples", "1", cwd=tmp_path)
    assert_one_error_line(proc, "check", "sm90 is built for sm_90a only", "the device is sm_80: pass --arch 90")


def test_check_unsupported_head_dim(tmp_path):
    require_family("sm80")
    proc = flashtune("check", "--family", "sm80", "--head-dim", "96", "--samples", "1", cwd=tmp_path)
    assert_one_error_line(proc, "check", "96")


def test_main_in_process_returns_exit_codes(capsys, tmp_path, monkeypatch):
    from tuner.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["tune", "--family", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flashtune tune: error: unknown kernel family") and err.count("\n") == 1
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"flashtune {__version__}"


def test_best_of_an_unknown_study_does_not_print_the_storage_password(monkeypatch, capsys):
    import optuna

    import tuner.study
    from tuner.cli import main

    monkeypatch.setattr(tuner.study, "open_storage", lambda url, create=True: object())

    def no_such_study(study_name, storage):
        raise KeyError("Record does not exist.")

    monkeypatch.setattr(optuna, "load_study", no_such_study)
    assert main(["best", "--study", "typo", "--storage", "postgresql+psycopg://ft:secret-pw@db.example/ft"]) == 2
    err = capsys.readouterr().err
    assert "no study named 'typo'" in err and "secret-pw" not in err and "db.example" in err


def _suite_with_one_study(tmp_path):
    """A suite of two problems in its own storage, one of them tuned, and a study of another problem beside."""
    from tests.fake_studies import family_for_tests, make_study

    family = family_for_tests()
    url = f"sqlite:///{tmp_path}/suite.db"
    suite = tmp_path / "two.toml"
    suite.write_text(
        f'family = "{family}"\nstorage = "{url}"\n[grid]\nhead_dim = 128\nheads = 16\nbatch = 2\nseqlen = [1024, 2048]\n'
    )
    tuned = Problem(batch=2, seqlen_q=1024, heads_q=16, head_dim=128)
    make_study(url, "in-suite", family, tuned, n_trials=6)
    make_study(url, "not-in-suite", family, Problem(batch=3, seqlen_q=512, heads_q=8, head_dim=64), n_trials=6)
    return suite, url


def test_studies_and_best_take_a_suite_its_storage_and_its_studies(tmp_path):
    suite, _url = _suite_with_one_study(tmp_path)
    listed = flashtune("studies", "--suite", str(suite), cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "in-suite" in listed.stdout and "not-in-suite" not in listed.stdout
    assert "(no study yet) fp16 d128 full N=2048 (B=2, H=16)" in listed.stdout

    best = flashtune("best", "--suite", str(suite), cwd=tmp_path)
    assert best.returncode == 0, best.stderr
    assert best.stdout.startswith("best of in-suite (") and "not-in-suite" not in best.stdout
    as_json = flashtune("best", "--suite", str(suite), "--json", cwd=tmp_path)
    assert [b["study"] for b in json.loads(as_json.stdout)] == ["in-suite"]
    one = flashtune("best", "--suite", str(suite), "--study", "in-suite", cwd=tmp_path)
    assert one.returncode == 0 and one.stdout.startswith("best of in-suite (")

    # the storage the suite names, not the default one, unless --storage says otherwise
    elsewhere = f"sqlite:///{tmp_path}/other.db"
    open_storage(elsewhere)
    proc = flashtune("studies", "--suite", str(suite), "--storage", elsewhere, cwd=tmp_path)
    assert_one_error_line(proc, "studies", "no study of suite two", f"flashtune tune --suite {suite}")


def test_a_missing_study_s_hint_names_the_storage_or_suite_that_lists_it(tmp_path):
    suite, url = _suite_with_one_study(tmp_path)
    proc = flashtune("best", "--suite", str(suite), "--study", "absent", cwd=tmp_path)
    assert_one_error_line(proc, "best", "no study named 'absent'", f"`flashtune studies --suite {suite}` lists them")
    proc = flashtune("best", "--storage", url, "--study", "absent", cwd=tmp_path)
    assert_one_error_line(proc, "best", f"`flashtune studies --storage {url}` lists them")
    proc = flashtune("export", "--dispatch", "--study", "nothing-*", "--storage", url, cwd=tmp_path)
    assert_one_error_line(proc, "export", f"`flashtune studies --storage {url}` lists them")
    proc = flashtune("report", "--suite", str(suite), "--study", "absent", cwd=tmp_path)
    assert_one_error_line(proc, "report", f"`flashtune studies --suite {suite}` lists them")
    proc = flashtune("best", cwd=tmp_path)
    assert_one_error_line(proc, "best", "--study NAME", "--suite FILE")


def test_the_hint_masks_a_password_and_quotes_the_url():
    from tuner.study import listing_hint

    hint = listing_hint("postgresql+psycopg://me:secret@db/x?a=1&b=2")
    assert "secret" not in hint and hint.startswith("`flashtune studies --storage '")
    assert (
        listing_hint("sqlite:///s.db", "studies/my suite.toml")
        == "`flashtune studies --suite 'studies/my suite.toml'` lists them"
    )
