"""tuner.files: one bounded reader for every file flashtune is handed, and no output over an input."""

from __future__ import annotations

import ast
import os
import threading
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tuner.files import (
    FileContentError,
    Input,
    OutputError,
    guard_outputs,
    inputs_noted,
    noted_inputs,
    read_limited,
    read_toml,
    write_text,
)

TUNER = REPO_ROOT / "tuner"

#: the only places that open files by themselves, each for a file nobody hands flashtune
OWN_FILES = {
    ("files/_read.py", "os.open"): "the bounded reader itself",
    ("files/_write.py", "open"): "writing through to a device or pipe named by -o",
    ("files/_write.py", "os.fdopen"): "the temporary file an atomic write renames",
    ("cli/_main.py", "os.open"): "/dev/null over a stdout whose reader left",
    ("cli/_process.py", "os.open"): "/dev/null over a closed standard stream",
    ("compile/_nvcc.py", "path.read_bytes"): "the digest of the package's own kernel_src/",
    ("compile/_nvcc.py", "meta_path.read_text"): "flashtune's own cubin cache",
    ("compile/_nvcc.py", "os.fdopen"): "flashtune's own cubin cache",
    ("study/_heartbeat.py", "open"): "/proc files of this host's processes",
}
_READING_CALLS = {"open", "fdopen", "read_text", "read_bytes", "load"}


def _file_reads() -> set[tuple[str, str]]:
    found = set()
    for path in sorted(TUNER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in _READING_CALLS:
                found.add((path.relative_to(TUNER).as_posix(), ast.unparse(func)))
    return found


def test_every_file_a_user_hands_flashtune_goes_through_the_bounded_reader():
    """No open(), read_text(), read_bytes() or json/toml/pickle.load() outside the reader and the
    allowed places: a space, suite, header or JSON file is read with a size cap, never from a FIFO."""
    unexpected = sorted(_file_reads() - OWN_FILES.keys())
    assert not unexpected, f"read these through tuner.files.read_limited: {unexpected}"


def test_the_walk_finds_a_direct_read(tmp_path):
    source = "from pathlib import Path\nPath('x').read_text()\nopen('y')\n"
    calls = {ast.unparse(n.func) for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)}
    assert {"Path('x').read_text", "open"} <= calls


@pytest.mark.parametrize("kind", ["fifo", "device", "link to a device", "folder", "too large"])
def test_the_reader_refuses_what_is_not_a_small_regular_file(tmp_path, kind):
    path = tmp_path / "space.toml"
    if kind == "fifo":
        os.mkfifo(path)  # a writer never comes: the read must not wait for one
    elif kind == "device":
        path = Path("/dev/zero")  # endless: the read must not run on
    elif kind == "link to a device":
        path.symlink_to("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    else:
        path.write_bytes(b"x" * 2048)
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            read_limited(path, 1024)
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "the read blocked"
    assert isinstance(outcome[0], FileContentError), outcome
    assert "not a regular file" in str(outcome[0]) or "more than the 1024 bytes" in str(outcome[0])


def test_deeply_nested_toml_is_one_error(tmp_path):
    path = tmp_path / "deep.toml"
    path.write_text("x = " + "[" * 50_000 + "]" * 50_000 + "\n")
    with pytest.raises(FileContentError, match="not valid TOML: nested too deeply"):
        read_toml(path, what="the space file")


def test_a_missing_file_says_so(tmp_path):
    with pytest.raises(FileContentError) as info:
        read_toml(tmp_path / "nope.toml", what="the suite file")
    assert info.value.missing


# -- outputs against inputs ------------------------------------------------------------------------
def _db(tmp_path: Path) -> Path:
    db = tmp_path / "s.db"
    db.write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)
    return db


@pytest.mark.parametrize("how", ["same path", "relative", "symlink", "hard link", "dotted", "journal"])
def test_an_output_that_is_an_input_is_refused(tmp_path, monkeypatch, how):
    db = _db(tmp_path)
    before = db.read_bytes()
    monkeypatch.chdir(tmp_path)
    inputs = [Input("the study database", str(db)), Input("a journal of it", f"{db}-wal")]
    if how == "same path":
        out = str(db)
    elif how == "relative":
        out = "s.db"
    elif how == "symlink":
        (tmp_path / "link.h").symlink_to(db)
        out = "link.h"
    elif how == "hard link":
        os.link(db, tmp_path / "hard.h")
        out = "hard.h"
    elif how == "dotted":
        (tmp_path / "sub").mkdir()
        out = "sub/../s.db"
    else:
        out = "s.db-wal"  # not there yet: SQLite would create it
    with pytest.raises(OutputError, match="this command reads"):
        guard_outputs([out], inputs)
    with pytest.raises(OutputError), inputs_noted(inputs):
        write_text("#define X 1\n", out)
    assert db.read_bytes() == before


def test_a_file_read_on_the_way_is_an_input_too(tmp_path):
    space = tmp_path / "space.toml"
    space.write_text("a = 1\n")
    with inputs_noted():
        read_toml(space, what="the space file")
        assert [i.what for i in noted_inputs()] == ["the space file"]
        with pytest.raises(OutputError, match="the space file this command reads"):
            write_text("x", space)
    assert space.read_text() == "a = 1\n"
    write_text("x", space)  # outside a command nothing is noted
    assert space.read_text() == "x"


def test_stdout_redirected_into_an_input_is_refused(tmp_path):
    db = _db(tmp_path)
    with open(db, "ab") as f:
        saved = os.dup(1)
        try:
            os.dup2(f.fileno(), 1)
            with pytest.raises(OutputError, match="this command reads"):
                guard_outputs(["/dev/stdout"], [Input("the study database", str(db))])
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def test_two_outputs_that_are_one_file_are_refused(tmp_path):
    (tmp_path / "a.h").write_text("")
    (tmp_path / "b.json").symlink_to(tmp_path / "a.h")
    with pytest.raises(OutputError, match="other output"):
        guard_outputs([tmp_path / "a.h", tmp_path / "b.json"])


def test_distinct_files_pass(tmp_path):
    db = _db(tmp_path)
    guard_outputs([tmp_path / "best.h", tmp_path / "best.json", "/dev/null"], [Input("the study database", str(db))])
