"""tuner.output: -o FILE is replaced atomically when it is a regular file, written through when it is not."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from tuner.files import OutputError, check_output_path, write_text


def test_a_new_file_gets_the_usual_permissions_and_no_temporary_file_is_left(tmp_path):
    path = write_text("hello", tmp_path / "new.h")
    umask = os.umask(0)
    os.umask(umask)
    assert path.read_text() == "hello"
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["new.h"]


def test_an_existing_file_is_replaced_and_keeps_its_mode(tmp_path):
    path = tmp_path / "old.h"
    path.write_text("old")
    path.chmod(0o640)
    write_text("new", path)
    assert path.read_text() == "new" and stat.S_IMODE(path.stat().st_mode) == 0o640


def test_a_symlink_keeps_pointing_at_the_file_it_names(tmp_path):
    target = tmp_path / "target.h"
    target.write_text("old")
    link = tmp_path / "link.h"
    link.symlink_to(target)
    write_text("new", link)
    assert link.is_symlink() and os.readlink(link) == str(target) and target.read_text() == "new"


def test_a_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "link.h"
    link.symlink_to(tmp_path / "later.h")
    write_text("x", link)
    assert link.is_symlink() and (tmp_path / "later.h").read_text() == "x"


def test_dev_null_stays_a_device():
    before = os.stat("/dev/null")
    write_text("discarded", "/dev/null")
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and (after.st_rdev, after.st_mode) == (before.st_rdev, before.st_mode)


def test_a_fifo_is_written_through(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    write_text("through the pipe", fifo)
    reader.join(timeout=10)
    assert got == ["through the pipe"] and stat.S_ISFIFO(fifo.lstat().st_mode)


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda d: d, "is a directory"),
        (lambda d: d / "missing" / "x.h", "does not exist"),
        (lambda d: d / ("n" * 400 + ".h"), "too long|longer than"),
        (lambda d: "", "empty"),
    ],
)
def test_unusable_paths_are_refused_with_one_line(tmp_path, make, fragment):
    with pytest.raises(OutputError, match=fragment) as info:
        check_output_path(make(tmp_path))
    assert "\n" not in str(info.value)


def test_a_socket_is_refused(tmp_path):
    import socket

    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        with pytest.raises(OutputError, match="not a regular file"):
            write_text("x", path)


def test_streams_are_told_from_files(tmp_path):
    from tuner.files import is_stream

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "file.md").write_text("x")
    assert is_stream("/dev/null") and is_stream(fifo)
    assert not is_stream(tmp_path / "file.md") and not is_stream(tmp_path / "new.md") and not is_stream("")
