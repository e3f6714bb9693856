"""What a command reads it never overwrites or changes, what it reads is bounded, and what cannot be done
is said in one line: outputs against every input, reading commands that write nothing, bounded files
and grids, option values, standard output and the environment."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, fast_dir
from tests.fake_studies import family_for_tests, make_study
from tests.test_bad_input import refused, run, snapshot
from tuner.study import MAX_SUITE_PROBLEMS


def _suite_text(storage: str | None = None, *, family: str | None = None) -> str:
    lines = [f'family = "{family or family_for_tests()}"']
    if storage:
        lines.append(f'storage = "{storage}"')
    lines += ["[[problems]]", "batch = 4", "seqlen = 2048", "heads = 16", "head_dim = 128"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def folder():
    """A study database (WAL mode, as tuning leaves it) and a suite naming it, in one folder."""
    with fast_dir() as directory:
        make_study(f"sqlite:///{directory}/s.db", "good", n_trials=8, failures=False)
        (directory / "suite.toml").write_text(_suite_text(f"sqlite:///{directory}/s.db"))
        yield directory


@pytest.fixture
def unchanged(folder):
    before = snapshot(folder)
    yield folder
    assert snapshot(folder) == before


def _flashtune_sh(args: str, *, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m tuner ARGS`` through the shell (for its redirections); stderr captured."""
    return subprocess.run(
        ["sh", "-c", f"exec {sys.executable} -m tuner {args}"],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        check=False,
    )


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- 1. -o is never one of the command's inputs --------------------------------------------------------------
def _output_for(folder: Path, how: str) -> str:
    db = folder / "s.db"
    if how == "the database":
        return str(db)
    if how == "its WAL":
        return f"{db}-wal"
    if how == "its journal":
        return f"{db}-journal"
    if how == "a link to it":
        link = folder / "link.h"
        if not link.is_symlink():
            link.symlink_to(db)
        return str(link)
    if how == "a hard link to it":
        hard = folder / "hard.h"
        if not hard.exists():
            os.link(db, hard)
        return str(hard)
    if how == "the suite":
        return str(folder / "suite.toml")
    raise AssertionError(how)


COMMANDS = {
    "export": lambda f: ["export", "--study", "good", "--storage", f"sqlite:///{f}/s.db"],
    "export --dispatch": lambda f: ["export", "--dispatch", "--study", "g*", "--storage", f"sqlite:///{f}/s.db"],
    "export --dispatch --suite": lambda f: ["export", "--dispatch", "--suite", f"{f}/suite.toml"],
    "report": lambda f: ["report", "--study", "good", "--storage", f"sqlite:///{f}/s.db"],
    "report --suite": lambda f: ["report", "--suite", f"{f}/suite.toml"],
    "bench --suite": lambda f: ["bench", "--suite", f"{f}/suite.toml"],
}
OUTPUTS = ["the database", "its WAL", "its journal", "a link to it", "a hard link to it", "the suite"]


@pytest.mark.parametrize("how", OUTPUTS)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_no_output_is_an_input(capsys, folder, command, how):
    if how == "the suite" and "--suite" not in command:
        pytest.skip("the command reads no suite")
    for name in ("link.h", "hard.h"):  # made before the snapshot: the test is that nothing changes
        _output_for(folder, "a link to it" if name == "link.h" else "a hard link to it")
    before = snapshot(folder)
    refused(capsys, *COMMANDS[command](folder), "-o", _output_for(folder, how), fragments=("this command reads",))
    assert snapshot(folder) == before


def test_the_json_beside_a_dispatch_header_is_no_input_either(capsys, folder, tmp_path):
    """-o tuned.h writes tuned.json beside it: refused when tuned.json is the database."""
    source, copy = sqlite3.connect(f"file:{folder}/s.db?mode=ro", uri=True), sqlite3.connect(tmp_path / "tuned.json")
    source.backup(copy)
    source.close()
    copy.close()
    before = snapshot(tmp_path)
    refused(
        capsys,
        "export",
        "--dispatch",
        "--study",
        "g*",
        "--storage",
        f"sqlite:///{tmp_path}/tuned.json",
        "-o",
        str(tmp_path / "tuned.h"),
        fragments=("tuned.json", "this command reads"),
    )
    assert snapshot(tmp_path) == before


def test_a_space_file_is_an_input(capsys, folder, tmp_path):
    from tuner.space import load_space

    space = Path(load_space(family_for_tests()).path)
    copy = tmp_path / space.name
    copy.write_bytes(space.read_bytes())
    (tmp_path / "suite.toml").write_text(_suite_text(f"sqlite:///{folder}/s.db", family=str(copy)))
    digest = _digest(copy)
    refused(capsys, "report", "--suite", str(tmp_path / "suite.toml"), "-o", str(copy), fragments=("space file",))
    assert _digest(copy) == digest


def test_an_output_path_naming_a_folder_is_refused(capsys, unchanged, tmp_path):
    refused(
        capsys,
        "export",
        "--study",
        "good",
        "--storage",
        f"sqlite:///{unchanged}/s.db",
        "-o",
        f"{tmp_path}/newdir/",
        fragments=("names a folder",),
    )
    assert not (tmp_path / "newdir").exists()


def test_distinct_outputs_still_work(capsys, unchanged, tmp_path):
    rc, _, err = run(
        capsys, "export", "--study", "good", "--storage", f"sqlite:///{unchanged}/s.db", "-o", str(tmp_path / "b.h")
    )
    assert rc == 0, err
    assert "FLASHTUNE_FAMILY" in (tmp_path / "b.h").read_text()


# -- 2. reading commands change no byte ------------------------------------------------------------------------
def _without(folder: Path, tmp_path: Path, *tables: str, keep_only: tuple[str, ...] = ()) -> Path:
    db = tmp_path / "partial.db"
    source, conn = sqlite3.connect(f"file:{folder}/s.db?mode=ro", uri=True), sqlite3.connect(db)
    source.backup(conn)  # with what the WAL holds
    source.close()
    try:
        conn.execute("PRAGMA journal_mode=DELETE")
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for name in names:
            if name in tables or (keep_only and name not in keep_only and not name.startswith("sqlite_")):
                conn.execute(f'DROP TABLE "{name}"')
        conn.commit()
    finally:
        conn.close()
    return db


READERS = {
    "best": ["best", "--study", "good"],
    "studies": ["studies"],
    "export": ["export", "--study", "good"],
    "report": ["report", "--study", "good", "-o", "/dev/null"],
    "replay": ["replay", "--study", "good", "--seeds", "1", "--budget", "2", "--jobs", "1"],
}


@pytest.mark.parametrize("missing", ["trial_heartbeats", "alembic_version", "only the core tables"])
@pytest.mark.parametrize("command", sorted(READERS))
def test_reading_commands_never_complete_a_schema(capsys, folder, tmp_path, command, missing):
    if missing == "only the core tables":
        db = _without(folder, tmp_path, keep_only=("studies", "trials", "version_info"))
    else:
        db = _without(folder, tmp_path, missing)
    before = snapshot(tmp_path)
    refused(capsys, *READERS[command], "--storage", f"sqlite:///{db}", fragments=("lacks Optuna's",))
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", ["best", "studies", "export", "report"])
def test_reading_commands_leave_a_live_database_byte_for_byte(capsys, unchanged, command):
    argv = [*READERS[command], "--storage", f"sqlite:///{unchanged}/s.db"]
    rc, _, err = run(capsys, *argv)
    assert rc == 0, err


# -- 3. SQLite URI options ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///file:{db}?uri=true",
        "sqlite:///file:{db}",
        "sqlite:///{db}?mode=rwc",
        "sqlite:///{db}?immutable=1",
        "sqlite:///{db}?vfs=unix-none&uri=true",
        "sqlite:///{db}?timeout=1",
    ],
)
@pytest.mark.parametrize("command", ["studies", "tune"])
def test_sqlite_url_options_are_refused(capsys, tmp_path, url, command):
    app = tmp_path / "app.db"
    conn = sqlite3.connect(app)
    conn.execute("CREATE TABLE accounts (id INTEGER)")
    conn.commit()
    conn.close()
    before = snapshot(tmp_path)
    refused(capsys, command, "--storage", url.format(db=app), fragments=("not supported",))
    assert snapshot(tmp_path) == before


# -- 4. replay: bounded processes, real samplers, an exhaustive study -----------------------------------------
@pytest.mark.parametrize("jobs", ["100000000", "0", "-1"])
def test_replay_jobs_are_bounded(capsys, unchanged, jobs):
    refused(
        capsys,
        "replay",
        "--study",
        "good",
        "--storage",
        f"sqlite:///{unchanged}/s.db",
        "--jobs",
        jobs,
        fragments=("--jobs",),
    )


@pytest.mark.parametrize("samplers", ["", ",", "tpe,,random", "tpe,tpe", " "])
def test_replay_samplers_must_be_named(capsys, unchanged, samplers):
    refused(
        capsys,
        "replay",
        "--study",
        "good",
        "--storage",
        f"sqlite:///{unchanged}/s.db",
        "--samplers",
        samplers,
        fragments=("--samplers",),
    )


def test_replay_refuses_a_study_that_is_no_exhaustive_sweep(capsys, unchanged):
    refused(
        capsys,
        "replay",
        "--study",
        "good",
        "--storage",
        f"sqlite:///{unchanged}/s.db",
        "--seeds",
        "2",
        "--budget",
        "20",
        "--jobs",
        "2",
        "--samplers",
        "random",
        fragments=("every feasible config",),
    )


# -- 5, 6, 8, 9. space and suite files: bounded reads, bounded grids, deep nesting, known archs -------------------
def _special(tmp_path: Path, kind: str, name: str) -> Path:
    path = tmp_path / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "huge":
        path.write_bytes(b"# " + b"x" * (2 << 20) + b"\n")
    elif kind == "deep":
        path.write_text("x = " + "[" * 50_000 + "]" * 50_000 + "\n")
    return path


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero", "huge", "deep"])
@pytest.mark.parametrize("command", ["tune --suite", "report --suite", "export --dispatch --suite", "check --family"])
def test_space_and_suite_files_are_read_bounded(capsys, tmp_path, command, kind):
    path = _special(tmp_path, kind, "bad.toml")
    argv = {
        "tune --suite": ["tune", "--suite", str(path), "--storage", f"sqlite:///{tmp_path}/x.db"],
        "report --suite": ["report", "--suite", str(path)],
        "export --dispatch --suite": ["export", "--dispatch", "--suite", str(path)],
        "check --family": ["check", "--family", str(path)],
    }[command]
    t0 = time.monotonic()
    line = refused(capsys, *argv)
    assert time.monotonic() - t0 < 30
    expected = {"fifo": "not a regular file", "link to /dev/zero": "not a regular file", "huge": "bytes such a file"}
    assert expected.get(kind, "nested too deeply") in line


@pytest.mark.parametrize("command", ["tune", "report", "export"])
def test_a_grid_is_counted_before_it_is_expanded(capsys, tmp_path, command):
    axes = "\n".join(f"{k} = [{', '.join(str(v) for v in range(1, 11))}]" for k in ("batch", "heads"))
    seqlens = ", ".join(str(128 * i) for i in range(1, 1001))
    dims = ", ".join(str(d) for d in range(1, 1001))
    suite = tmp_path / "grid.toml"
    suite.write_text(f'family = "{family_for_tests()}"\n[grid]\n{axes}\nseqlen = [{seqlens}]\nhead_dim = [{dims}]\n')
    argv = {"tune": ["tune"], "report": ["report"], "export": ["export", "--dispatch"]}[command]
    t0 = time.monotonic()
    refused(capsys, *argv, "--suite", str(suite), fragments=(f"{MAX_SUITE_PROBLEMS:,}", "100,000,000"))
    assert time.monotonic() - t0 < 10


def _space_with(tmp_path: Path, old: str, new: str) -> Path:
    from tuner.space import load_space

    text = Path(load_space(family_for_tests()).path).read_text()
    assert old in text, old
    path = tmp_path / f"{family_for_tests()}.toml"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize("arch", ["1000", "75", "10", "81"])
def test_an_unknown_min_arch_is_refused_at_load(capsys, tmp_path, arch):
    from tuner.space import load_space

    text = Path(load_space(family_for_tests()).path).read_text()
    current = next(line for line in text.splitlines() if line.startswith("min_arch"))
    path = _space_with(tmp_path, current, f"min_arch = {arch}")
    refused(capsys, "check", "--family", str(path), fragments=("min_arch",))


# -- 7. check --samples ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("samples", ["0", "-1", "00"])
def test_check_samples_zero_is_refused(capsys, samples):
    refused(capsys, "check", "--samples", samples, fragments=("positive number",))


# -- 15. option values ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["1e-300", "0.001", "5e-324", "1e300"])
@pytest.mark.parametrize("option", ["--trial-timeout", "--timeout"])
def test_absurd_timeouts_are_refused(capsys, tmp_path, option, value):
    refused(capsys, "tune", option, value, "--storage", f"sqlite:///{tmp_path}/x.db", fragments=(option,))
    assert not (tmp_path / "x.db").exists()


# -- 10. standard output full or closed -------------------------------------------------------------------------
@pytest.mark.parametrize("stdout", ["full", "closed"])
@pytest.mark.parametrize("command", ["studies", "export", "best"])
def test_standard_output_full_or_closed_is_one_line(folder, tmp_path, command, stdout):
    argv = {"studies": ["studies"], "export": ["export", "--study", "good"], "best": ["best", "--study", "good"]}
    args = " ".join([*argv[command], "--storage", f"sqlite:///{folder}/s.db"])
    redirect = "> /dev/full" if stdout == "full" else ">&-"
    digest = _digest(folder / "s.db")
    proc = _flashtune_sh(f"{args} {redirect}", cwd=tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0
    assert len(lines) == 1 and lines[0].startswith(f"flashtune {command}: error: cannot write to standard output"), (
        lines
    )
    assert _digest(folder / "s.db") == digest


# -- 16. environment variables --------------------------------------------------------------------------------------
@pytest.mark.parametrize("variable", ["FLASHTUNE_GRACE_PERIOD_S", "FLASHTUNE_HEARTBEAT_INTERVAL_S"])
@pytest.mark.parametrize("value", ["soon", "-1", "nan", "1e400", ""])
def test_a_bad_environment_value_is_one_warning_line(folder, tmp_path, variable, value):
    proc = _flashtune_sh(f"studies --storage sqlite:///{folder}/s.db > /dev/null", cwd=tmp_path, env={variable: value})
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"flashtune: warning: {variable}="), lines
    assert ".py" not in lines[0]
