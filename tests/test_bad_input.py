"""Hostile and careless input (issue 11): every one gives one line naming what is wrong (and what to do),
a non-zero exit, no traceback, no password, and leaves what is stored byte for byte as it was.

Most commands run in-process through ``tuner.cli.main`` (its last-resort handler turns an unexpected
exception into an "internal error" line, which these tests refuse too); what only a real process shows
(a closed pipe, the exit path) runs as ``python -m tuner``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import threading
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.conftest import REPO_ROOT, fast_dir
from tests.fake_studies import family_for_tests, make_study, open_fake_study
from tuner.cli import main
from tuner.paths import SEARCH_SPACES
from tuner.problem import Problem
from tuner.space import available_families, load_space

HAS_GPU = Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists()
PROBLEM = Problem(batch=4, seqlen_q=2048, heads_q=16, head_dim=128)
ESCAPED_NAME = "evil\x1b]0;pwned\x07\x1b[31mred\x1b[0m\u202e"


# -- helpers -----------------------------------------------------------------------------------------------
def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        rc = main(list(argv))
    except SystemExit as e:  # argparse refuses an option value itself
        rc = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return rc, out, err


def refused(capsys, *argv: str, fragments: tuple[str, ...] = (), secrets: tuple[str, ...] = ()) -> str:
    """Run a command that must fail: one line on stderr, ``flashtune <command>: error: ...``, non-zero."""
    rc, out, err = run(capsys, *argv)
    command = next(a for a in argv if not a.startswith("-"))
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc != 0, (argv, out, err)
    assert len(lines) == 1, (argv, err)
    line = lines[0]
    assert line.startswith(f"flashtune {command}: error: "), line
    assert "internal error" not in line and "Traceback" not in err, line
    assert "\x1b" not in out + err and "\x07" not in out + err
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    for secret in secrets:
        assert secret not in out + err, (secret, line)
    return line


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` with its bytes (a new journal, WAL or stray file shows as a new key)."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def flashtune(*args: str, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        **kwargs,
    )


@pytest.fixture(scope="module")
def db():
    """A storage with the studies the failures below are tried on, and the folder it lives in."""
    with fast_dir() as directory:
        url = f"sqlite:///{directory}/studies.db"
        space = load_space(family_for_tests())
        make_study(url, "good", n_trials=10, failures=False)
        open_fake_study(url, "empty", space, PROBLEM)  # made by flashtune, no trial measured yet
        failed = open_fake_study(url, "all-failed", space, PROBLEM)
        trial = failed.ask()
        failed.set_user_attr("unused", 1)
        failed.tell(trial, state=TrialState.PRUNED)
        plain = optuna.create_study(study_name="plain", storage=url, direction="minimize")
        plain.optimize(lambda t: t.suggest_float("x", 0, 1) * 1e9, n_trials=3)
        stale = make_study(url, "stale-config", n_trials=6, failures=False)
        stale.set_user_attr(
            "winner",
            dict(stale.user_attrs["winner"], config={**stale.user_attrs["winner"]["config"], space.knobs[0].name: 999}),
        )
        make_study(url, "bad-winner", n_trials=6, failures=False).set_user_attr("winner", "garbage")
        make_study(url, ESCAPED_NAME, n_trials=6, failures=False)
        infinite = make_study(url, "infinite", n_trials=6, failures=False, winner=False)
        best = max(infinite.get_trials(states=(TrialState.COMPLETE,)), key=lambda t: t.value)
        infinite.add_trial(
            optuna.trial.create_trial(
                value=math.inf, params=best.params, distributions=best.distributions, user_attrs={"status": "ok"}
            )
        )
        yield url, directory


@pytest.fixture
def untouched(db):
    """Asserts that the test leaves the storage folder byte for byte as it found it."""
    url, directory = db
    before = snapshot(directory)
    yield url
    assert snapshot(directory) == before


# -- 1. -o writes into what it names, never replaces a device, pipe or link ------------------------------
def test_export_to_dev_null_keeps_the_device(capsys, untouched, tmp_path):
    before = os.stat("/dev/null")
    rc, _out, err = run(capsys, "export", "--study", "good", "--storage", untouched, "-o", "/dev/null")
    assert rc == 0, err
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev


def test_report_to_dev_stdout_writes_through(tmp_path, db):
    url, _ = db
    proc = flashtune("report", "--study", "good", "--storage", url, "-o", "/dev/stdout", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.lstrip().lower().startswith("<!doctype html")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_export_into_a_fifo_writes_through_and_keeps_the_fifo(capsys, untouched, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    rc, _out, err = run(capsys, "export", "--study", "good", "--storage", untouched, "-o", str(fifo))
    reader.join(timeout=30)
    assert rc == 0, err
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert b"#define FT_" in received[0]


def test_export_through_a_symlink_replaces_the_target_and_keeps_the_link(capsys, untouched, tmp_path):
    target = tmp_path / "real.h"
    target.write_text("old")
    link = tmp_path / "link.h"
    link.symlink_to(target)
    rc, _out, err = run(capsys, "export", "--study", "good", "--storage", untouched, "-o", str(link))
    assert rc == 0, err
    assert link.is_symlink() and "#define FT_" in target.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.h", "real.h"]  # no temporary file left


@pytest.mark.parametrize("where", ["dir", "missing-folder", "long-name", "empty"])
def test_unusable_output_paths_are_refused_before_any_work(capsys, untouched, tmp_path, where):
    path = {
        "dir": str(tmp_path),
        "missing-folder": str(tmp_path / "no" / "x.h"),
        "long-name": str(tmp_path / ("x" * 300 + ".h")),
        "empty": "",
    }[where]
    fragment = "-o" if where == "empty" else "cannot write"
    refused(capsys, "export", "--study", "good", "--storage", untouched, "-o", path, fragments=(fragment,))
    refused(capsys, "report", "--study", "good", "--storage", untouched, "-o", path, fragments=(fragment,))


# -- 2. no password in any output ---------------------------------------------------------------------------
SECRET_URLS = [
    ("postgresql+psycopg://u:TopS3cret@127.0.0.1:notaport/postgres", ("TopS3cret",)),
    ("postgresql+psycopg://u:Top@S3cret@127.0.0.1:1/postgres", ("Top@S3cret", "S3cret@", "@S3cret")),
    ("postgresql+psycopg://u:pa%40ss-w0rd@127.0.0.1:1/db", ("pa%40ss-w0rd", "pa@ss-w0rd")),
    ("postgresql+psycopg://u@127.0.0.1:1/db?password=Qw3rty-Secret&sslmode=disable", ("Qw3rty-Secret",)),
    ("mysql+nosuchdriver://root:Hunter2-pw@localhost/optuna", ("Hunter2-pw",)),
    ("nosuchdb://u:Zz9-secret@host/db", ("Zz9-secret",)),
    ("u:Plain-Secret@host", ("Plain-Secret",)),
]


@pytest.mark.parametrize(("url", "secrets"), SECRET_URLS, ids=[f"url{i}" for i in range(len(SECRET_URLS))])
@pytest.mark.parametrize(
    "command",
    [("studies",), ("best", "--study", "x"), ("export", "--study", "x"), ("report", "--study", "x")],
    ids=lambda c: c[0],
)
def test_no_password_is_printed(capsys, tmp_path, monkeypatch, url, secrets, command):
    pytest.importorskip("psycopg")
    monkeypatch.chdir(tmp_path)
    refused(capsys, *command, "--storage", url, secrets=secrets)
    assert not (tmp_path / "studies").exists()


def test_no_password_from_a_suite_file(capsys, tmp_path, monkeypatch):
    pytest.importorskip("psycopg")
    monkeypatch.chdir(tmp_path)
    suite = tmp_path / "s.toml"
    suite.write_text(
        f'family = "{family_for_tests()}"\nstorage = "postgresql+psycopg://u:Su1te@Secret@127.0.0.1:x/db"\n'
        "[grid]\nhead_dim = 128\nheads = 2\nbatch = 1\nseqlen = 128\n"
    )
    for command in (
        ("report", "--suite", str(suite)),
        ("export", "--dispatch", "--suite", str(suite)),
        ("tune", "--suite", str(suite)),
        ("bench", "--suite", str(suite)),
    ):
        refused(capsys, *command, secrets=("Su1te@Secret", "Su1te", "Secret@127"))


# -- 3. other programs' SQLite files are never written; reading commands create nothing -----------------------
def _foreign_db(path: Path, tables: tuple[str, ...]) -> None:
    with sqlite3.connect(path) as conn:
        for table in tables:
            conn.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute(f"INSERT INTO {tables[0]} (name) VALUES ('kept')")
    conn.close()


COMMANDS = [
    ("studies",),
    ("best", "--study", "x"),
    ("export", "--study", "x"),
    ("report", "--study", "x"),
    ("bench", "--study", "x"),
    ("worker", "--study", "x"),
    ("tune",),
]


@pytest.mark.parametrize(
    "tables",
    [("users",), ("studies",), ("studies", "users"), ("studies", "trials", "version_info", "accounts")],
    ids=["users", "studies", "studies-and-users", "optuna-like-and-accounts"],
)
@pytest.mark.parametrize("name", ["app.db", "a#b.db", "with space.db"])
def test_another_program_s_database_is_refused_and_unchanged(capsys, tmp_path, monkeypatch, tables, name):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "data"
    folder.mkdir()
    _foreign_db(folder / name, tables)
    before = snapshot(folder)
    for command in COMMANDS:
        refused(capsys, *command, "--storage", f"sqlite:///{folder / name}", fragments=("another program",))
    assert snapshot(folder) == before


@pytest.mark.parametrize("content", ["new", "empty", "no-tables"])
@pytest.mark.parametrize("name", ["s.db", "s#1.db"])
def test_reading_commands_create_no_schema(capsys, tmp_path, content, name):
    path = tmp_path / name
    if content == "empty":
        path.touch()
    elif content == "no-tables":
        sqlite3.connect(path).close()
    before = snapshot(tmp_path)
    for command in COMMANDS[:-1]:
        refused(capsys, *command, "--storage", f"sqlite:///{path}", fragments=("no study database",))
    assert snapshot(tmp_path) == before


def test_reading_commands_change_no_byte_of_a_study_database(capsys, untouched):
    for command in (
        ("studies",),
        ("best", "--study", "good"),
        ("best", "--study", "good", "--json"),
        ("export", "--study", "good"),
        ("export", "--dispatch", "--study", "good"),
        ("report", "--study", "good", "-o", "/dev/null"),
    ):
        rc, _out, err = run(capsys, *command, "--storage", untouched)
        assert rc == 0, (command, err)


def test_a_database_with_random_bytes_inside_is_one_line(capsys, tmp_path, db):
    _url, directory = db
    broken = tmp_path / "broken.db"
    shutil.copy(directory / "studies.db", broken)
    data = bytearray(broken.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 8192] = os.urandom(8192)
    broken.write_bytes(bytes(data))
    before = broken.read_bytes()
    for command in (
        ("studies",),
        ("best", "--study", "good"),
        ("export", "--study", "good"),
        ("report", "--study", "good"),
    ):
        rc, _out, err = run(capsys, *command, "--storage", f"sqlite:///{broken}")
        if rc != 0:  # the damage may miss what a command reads; where it hits, one line
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith(f"flashtune {command[0]}: error: "), err
            assert "internal error" not in err
    assert broken.read_bytes() == before


@pytest.mark.parametrize("url", ["sqlite:///:memory:", "sqlite://", "sqlite:///file::memory:?cache=shared"])
def test_in_memory_storage_is_refused(capsys, tmp_path, monkeypatch, url):
    monkeypatch.chdir(tmp_path)
    for command in (("studies",), ("tune",), ("best", "--study", "x")):
        refused(capsys, *command, "--storage", url, fragments=("in-memory",))


@pytest.mark.parametrize("where", ["proc", "under-a-file", "directory", "device"])
def test_unwritable_or_impossible_database_paths(capsys, tmp_path, monkeypatch, where):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file.txt").write_text("x")
    path = {
        "proc": "/proc/flashtune-test/s.db",
        "under-a-file": str(tmp_path / "file.txt" / "s.db"),
        "directory": str(tmp_path),
        "device": "/dev/null",
    }[where]
    for command in (("tune",), ("studies",), ("best", "--study", "x"), ("export", "--study", "x")):
        refused(capsys, *command, "--storage", f"sqlite:///{path}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes read-only files")
def test_a_read_only_database_is_refused_for_tuning_and_read_for_reading(capsys, tmp_path, db):
    _url, directory = db
    copy = tmp_path / "ro.db"
    shutil.copy(directory / "studies.db", copy)
    copy.chmod(0o444)
    refused(capsys, "tune", "--storage", f"sqlite:///{copy}", fragments=("read-only",))
    rc, _out, err = run(capsys, "best", "--study", "good", "--storage", f"sqlite:///{copy}")
    assert rc == 0, err


def test_a_read_only_database_is_refused_before_tuning(capsys, tmp_path, monkeypatch, db):
    """As the root user (CI) cannot make a file read-only, the access check is what is tested here."""
    import tuner.study._storage

    _url, directory = db
    copy = tmp_path / "ro.db"
    shutil.copy(directory / "studies.db", copy)
    real_access = os.access
    monkeypatch.setattr(
        tuner.study._storage.os,
        "access",
        lambda path, mode: False if Path(path) == copy and mode & os.W_OK else real_access(path, mode),
    )
    before = snapshot(tmp_path)
    refused(capsys, "tune", "--storage", f"sqlite:///{copy}", fragments=("read-only",))
    rc, _out, err = run(capsys, "best", "--study", "good", "--storage", f"sqlite:///{copy}")
    assert rc == 0, err  # reading needs no write access
    assert snapshot(tmp_path) == before


# -- 4. space-file expressions stay cheap -------------------------------------------------------------------
def _space_copy(tmp_path: Path, family: str, edit) -> Path:
    text = (SEARCH_SPACES / f"{family}.toml").read_text()
    path = tmp_path / f"{family}.toml"
    path.write_text(edit(text))
    return path


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "expr",
    [
        "block_m ** block_m ** block_m > 0",
        "2 ** block_m > 0",
        "block_m ** 65 > 0",
        "9" * 3000 + " > 0",
        "(1 + " * 200 + "1" + ")" * 200 + " > 0",
        " * ".join(["block_m"] * 10) + " > 0",
    ],
)
def test_unbounded_expressions_are_refused_or_bounded(capsys, tmp_path, expr):
    require = "sm80"
    if require not in available_families():
        pytest.skip("sm80 space file missing")
    path = _space_copy(tmp_path, require, lambda t: t + f'\n[constraints.hostile]\nexpr = "{expr}"\nmessage = "m"\n')
    rc, out, err = run(capsys, "check", "--family", str(path), "--samples", "1", "--jobs", "1")
    if rc == 0:  # bounded at evaluation: every config is refused with the reason, none hangs
        pytest.fail(f"a hostile constraint let `check` pass: {out[-500:]}")
    assert "Traceback" not in err and "internal error" not in err


# -- 5. nothing from a space file reaches a header or a path unchecked ----------------------------------------
HOSTILE_SPACES = {
    "arch-suffix-newline": (
        lambda t: t.replace('arch_suffix = ""', 'arch_suffix = "a\\n#define FT_EVIL 1"'),
        "arch_suffix",
    ),
    "knob-name-newline": (lambda t: t.replace("[knobs.block_m]", '[knobs."block_m\\n"]'), "lower_snake_case"),
    "macro-newline": (lambda t: t.replace('macro = "FT_BLOCK_M"', 'macro = "FT_BLOCK_M\\n"'), "FT_UPPER_CASE"),
    "source-outside": (
        lambda t: t.replace('source = "sm80/flash_fwd.cu"', 'source = "../../../../etc/passwd"'),
        "inside kernel_src/",
    ),
    "source-absolute": (
        lambda t: t.replace('source = "sm80/flash_fwd.cu"', 'source = "/etc/passwd"'),
        "inside kernel_src/",
    ),
    "source-newline": (
        lambda t: t.replace('source = "sm80/flash_fwd.cu"', 'source = "sm80/flash_fwd.cu\\n"'),
        "inside kernel_src/",
    ),
    "config-header-outside": (
        lambda t: t.replace('config_header = "sm80/config.cuh"', 'config_header = "sm80/../../README.md"'),
        "inside kernel_src/",
    ),
    "entry-injection": (lambda t: t.replace('entry = "flashtune_fwd"', 'entry = "f(); system(\\"x\\")"'), "entry"),
    "abi-newline": (lambda t: t.replace('abi = "flat"', 'abi = "flat\\n"'), "abi"),
    "bool-values": (
        lambda t: t.replace(
            '[knobs.q_in_regs]\nmacro = "FT_Q_IN_REGS"\nvalues = [0, 1]',
            '[knobs.q_in_regs]\nmacro = "FT_Q_IN_REGS"\nvalues = [false, true]',
        ),
        "integers",
    ),
    "huge-values": (lambda t: t.replace("values = [0, 1]", "values = [0, 100000000000000]", 1), "C int"),
    "constraint-name-newline": (
        lambda t: t + '\n[constraints."x\\ny"]\nexpr = "1"\nmessage = "m"\n',
        "lower_snake_case",
    ),
    "macro-never-read": (lambda t: t.replace('macro = "FT_PV_SPLIT"', 'macro = "FT_NOPE"'), "never read"),
    "derived-macro-never-read": (
        lambda t: t.replace('macro = "FT_SMEM_BYTES"', 'macro = "FT_SMEM_NOPE"'),
        "never read",
    ),
    "head-dims-bool": (lambda t: t.replace("head_dims = [64, 128]", "head_dims = [true]"), "head_dims"),
    "min-arch-text": (lambda t: t.replace("min_arch = 80", 'min_arch = "80"'), "min_arch"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_SPACES))
def test_hostile_space_files_are_refused_at_load(capsys, tmp_path, case):
    if "sm80" not in available_families():
        pytest.skip("sm80 space file missing")
    edit, fragment = HOSTILE_SPACES[case]
    path = _space_copy(tmp_path, "sm80", edit)
    assert path.read_text() != (SEARCH_SPACES / "sm80.toml").read_text(), "the edit did not apply"
    refused(capsys, "check", "--family", str(path), "--samples", "1", fragments=(fragment,))


@pytest.mark.parametrize("family", ["../../etc/passwd", "sm80\n", "sm80/../sm80", "", " sm80"])
def test_family_names_are_names(capsys, tmp_path, monkeypatch, family):
    monkeypatch.chdir(tmp_path)
    refused(capsys, "check", "--family", family, fragments=("unknown kernel family",))


def test_latin1_space_and_suite_files(capsys, tmp_path):
    text = (SEARCH_SPACES / "sm80.toml").read_text().replace('description = "', 'description = "caf\u00e9 ', 1)
    path = tmp_path / "sm80.toml"
    path.write_bytes(text.encode("latin-1"))
    refused(capsys, "check", "--family", str(path), fragments=("not UTF-8",))
    suite = tmp_path / "suite.toml"
    suite.write_bytes('description = "caf\u00e9"\nfamily = "sm80"\n'.encode("latin-1"))
    for command in (
        ("tune", "--suite", str(suite)),
        ("report", "--suite", str(suite)),
        ("export", "--dispatch", "--suite", str(suite)),
        ("bench", "--suite", str(suite)),
    ):
        refused(capsys, *command, fragments=("not UTF-8",))


# -- 6. names from a database are printed escaped --------------------------------------------------------------
def test_terminal_escapes_in_study_names_are_printed_escaped(capsys, untouched):
    rc, out, err = run(capsys, "studies", "--storage", untouched)
    assert rc == 0 and "\x1b" not in out + err and "\\x1b" in out and "\u202e" not in out
    rc, out, err = run(capsys, "best", "--study", ESCAPED_NAME, "--storage", untouched)
    assert rc == 0, err
    assert "\x1b" not in out + err and "\x07" not in out + err and "\\x1b" in out


def test_a_new_study_name_with_control_characters_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    refused(capsys, "tune", "--study", "a\x1b[2Jb", fragments=("control characters",))
    assert not (tmp_path / "studies").exists()


# -- 9. best, export, bench and report share one check ----------------------------------------------------------
@pytest.mark.parametrize(
    ("study", "fragment"),
    [
        ("plain", "not created by flashtune"),
        ("stale-config", "no longer fits"),
        ("bad-winner", "malformed winner"),
        ("empty", "no successful trial"),
        ("all-failed", "no successful trial"),
        ("absent", "no study named 'absent'"),
    ],
)
def test_best_export_bench_report_refuse_the_same_studies(capsys, untouched, tmp_path, monkeypatch, study, fragment):
    monkeypatch.chdir(tmp_path)
    for command in (("best",), ("best", "--json"), ("export",), ("bench",)):
        refused(capsys, *command, "--study", study, "--storage", untouched, fragments=(fragment,))
    if study not in ("stale-config", "bad-winner"):  # a report shows these, with a note
        refused(
            capsys,
            "report",
            "--study",
            study,
            "--storage",
            untouched,
            fragments=(fragment if study != "all-failed" else "no successful trial",),
        )
    assert list(tmp_path.iterdir()) == []  # no report page written


def test_a_malformed_study_does_not_hide_the_others(capsys, untouched):
    rc, out, err = run(capsys, "studies", "--storage", untouched)
    assert rc == 0, err
    names = [line.split()[0] for line in out.splitlines()[1:]]
    assert {"good", "bad-winner", "stale-config", "empty", "infinite"} <= set(names) and "plain" not in names


def test_best_json_is_strict_json(capsys, untouched):
    rc, out, err = run(capsys, "best", "--study", "infinite", "--storage", untouched, "--json")
    assert rc == 0, err
    assert "Infinity" not in out and "NaN" not in out
    json.loads(out, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))


# -- 11. option values ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (("tune", "--timeout", "nan"), "--timeout"),
        (("tune", "--timeout", "inf"), "--timeout"),
        (("tune", "--timeout", "-inf"), "--timeout"),
        (("tune", "--trial-timeout", "nan"), "--trial-timeout"),
        (("tune", "--trial-timeout", "inf"), "--trial-timeout"),
        (("worker", "--study", "x", "--timeout", "nan"), "--timeout"),
        (("tune", "--seed", "-1"), "--seed"),
        (("tune", "--seed", str(2**40)), "--seed"),
        (("check", "--seed", "-1"), "--seed"),
        (("check", "--jobs", "0"), "--jobs"),
        (("check", "--jobs", "-3"), "--jobs"),
        (("check", "--jobs", "1000000"), "--jobs"),
        (("tune", "--compile-workers", "100000000"), "--compile-workers"),
        (("tune", "--rounds", str(10**23)), "--rounds"),
        (("check", "--samples", "-2"), "--samples"),
        (("check", "--samples", "some"), "--samples"),
        (("tune", "--study", ""), "--study"),
        (("tune", "--study", "   "), "--study"),
        (("best", "--study", ""), "--study"),
        (("report", "--study", "x" * 100_000), "--study"),
        (("export", "--study", "x" * 513), "--study"),
        (("tune", "--storage", ""), "--storage"),
        (("tune", "--seqlen", "1e20"), "--seqlen"),
        (("tune", "--seqlen", str(10**20)), "seqlen_q"),
        (("tune", "--batch", str(2**31)), "batch"),
        (("tune", "--head-dim", "nan"), "--head-dim"),
        (("tune", "--gpus", "0,0"), "--gpus"),
        (("tune", "--gpus", "-1"), "--gpus"),
        (("tune", "--gpus", "x"), "--gpus"),
        (("bench", "--gpu", "-1"), "--gpu"),
        (("tune", "--sampler", "nope"), "--sampler"),
        (("tune", "--trials", "0"), "--trials"),
        (("bench", "--config", "block_m=1e3"), "--config"),
        (("bench", "--config", "block_m"), "--config"),
        (("bench", "--config", "no_such_knob=1"), "unknown knob"),
    ],
)
def test_option_values_are_checked(capsys, tmp_path, monkeypatch, argv, fragment):
    monkeypatch.chdir(tmp_path)
    refused(capsys, *argv, fragments=(fragment,))
    assert not (tmp_path / "studies").exists()


def test_a_problem_beyond_cuda_grid_limits_is_statically_infeasible():
    from tuner.devices import limits_for_arch

    space = load_space(family_for_tests())
    problem = Problem(batch=2**20, seqlen_q=128, heads_q=1, head_dim=128)
    reason = space.check(space.defaults(128), problem, limits_for_arch(80))
    assert reason and "grid" in reason and "65535" in reason


# -- tracebacks turned into one line ----------------------------------------------------------------------------
def test_best_json_into_a_closed_pipe_is_quiet(tmp_path, db):
    url, _ = db
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner", "best", "--study", "good", "--storage", url, "--json"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # `| head -0`: the reader is gone before the first byte
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "Traceback" not in err and "Exception ignored" not in err and "BrokenPipe" not in err, err
    assert proc.returncode != 0


def test_studies_piped_into_head_is_quiet(tmp_path, db):
    url, _ = db
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        f"{sys.executable} -m tuner studies --storage '{url}' | head -1",
        shell=True,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.stdout.startswith("study") and "Traceback" not in proc.stderr and "Exception" not in proc.stderr


def test_storage_failures_name_the_database_error_not_optuna_s_guess():
    from sqlalchemy.exc import OperationalError

    from tuner.study import StorageError, error_reason, retrying

    try:
        try:
            raise OperationalError("SELECT 1", {}, Exception("connection to server at 127.0.0.1 refused"))
        except OperationalError as cause:
            raise optuna.exceptions.StorageInternalError(
                "An exception is raised during the commit. This typically "
                "happens due to invalid data in the commit, e.g. exceeding "
                "max length."
            ) from cause
    except optuna.exceptions.StorageInternalError as e:
        internal = e
    assert "connection to server" in error_reason(internal) and "max length" not in error_reason(internal)

    def down():
        raise internal

    with open(os.devnull, "w") as log, pytest.raises(StorageError, match="connection to server") as info:
        retrying(down, what="testing", attempts=2, first_delay_s=0.01, log=log)
    assert "max length" not in str(info.value)


# -- papercuts --------------------------------------------------------------------------------------------------
def test_family_help_lists_the_families(capsys):
    for command in ("tune", "check", "bench"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = " ".join(capsys.readouterr().out.split())
        assert all(f in out for f in available_families()), out


def test_check_help_says_how_to_ask_for_every_config(capsys):
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "'all'" in out and "minute" in out


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_tune_without_a_gpu_says_so_once_and_creates_nothing(tmp_path):
    proc = flashtune("tune", "--trials", "2", cwd=tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("flashtune tune: error: no usable GPU 0") and "flashtune check" in lines[0]
    assert "insufficient" not in lines[0] or "driver" in lines[0]
    assert list(tmp_path.iterdir()) == []  # no studies/flashtune.db


@pytest.mark.postgres
def test_a_postgres_outage_is_named_as_one(capsys, postgres, tmp_path):
    make_study(postgres.url, "kept", n_trials=4, failures=False)
    postgres.stop()
    try:
        for command in (("studies",), ("best", "--study", "kept"), ("export", "--study", "kept"), ("tune",)):
            line = refused(capsys, *command, "--storage", postgres.url, secrets=("secret-pw",))
            assert "max length" not in line and ("connect" in line or "refused" in line), line
    finally:
        postgres.start()
    rc, _out, err = run(capsys, "best", "--study", "kept", "--storage", postgres.url)
    assert rc == 0, err  # nothing was lost


def test_the_tune_banner_prints_names_escaped(capsys, tmp_path, monkeypatch):
    """The study and GPU names in the banner come from the storage and the driver: escaped, like everywhere."""
    import tuner.cli._commands
    import tuner.run._run
    from tests.fake_studies import H200_INFO

    monkeypatch.chdir(tmp_path)
    info = dict(H200_INFO, name="NVIDIA\x1b[2J H200\x07")
    import contextlib

    @contextlib.contextmanager
    def open_gpus(gpus):
        yield [None for _ in gpus], [info for _ in gpus]

    monkeypatch.setattr(tuner.run, "open_gpus", open_gpus)
    monkeypatch.setattr(tuner.run, "run_on_gpus", lambda spec, gpus, infos, **kw: None)
    monkeypatch.setattr(tuner.cli._commands, "_retime_and_print", lambda spec, worker, args: 0)
    rc, _out, err = run(capsys, "tune", "--trials", "1", "--storage", f"sqlite:///{tmp_path}/s.db")
    assert rc == 0, err
    assert "\x1b" not in err and "\x07" not in err and "NVIDIA\\x1b[2J H200\\x07" in err
