"""Writing what a command produces (``-o FILE``): atomically over regular files, through to anything else.

A regular file (or a new path) is replaced atomically: written to a temporary file beside it,
then renamed over it, so a reader never sees half a header and an interrupted write leaves the
old file. A symbolic link is followed: the file it points to is replaced and the link stays.
``/dev/stdout``, ``/dev/null``, a FIFO or a terminal are written to as they are: renaming a
regular file over them would replace the device node or pipe.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from ..text import printable
from ._errors import OutputError
from ._inputs import guard_outputs

__all__ = ["OutputError", "check_output_path", "is_stream", "write_text"]


def _fail(path: str | Path, why: str) -> OutputError:
    return OutputError(f"cannot write {printable(path, 160)}: {why}")


def _mode(path: Path) -> int | None:
    """The mode of what ``path`` names, links followed (``/dev/stdout`` to the pipe itself); None if nothing."""
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        return None


def is_stream(path: str | Path) -> bool:
    """Whether ``path`` names a device or pipe (``/dev/stdout``, a FIFO) rather than a file."""
    mode = _mode(Path(path)) if str(path) else None
    return mode is not None and not stat.S_ISREG(mode)


def check_output_path(path: str | Path) -> Path:
    """``path`` if a file can be written there, else :class:`OutputError` (checked before any work is done)."""
    if not str(path):
        raise OutputError("the output file name is empty; give a file name with -o")
    if str(path).endswith((os.sep, f"{os.sep}.", f"{os.sep}..")) or str(path) in (".", ".."):
        raise _fail(path, "it names a folder; give a file name, e.g. out/best.h")
    path = Path(path)
    try:
        mode = _mode(path)
        if mode is not None:
            if stat.S_ISDIR(mode):
                raise _fail(path, "it is a directory; give a file name")
            if not (stat.S_ISREG(mode) or stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
                raise _fail(path, "it is not a regular file, a character device or a pipe")
            if not os.access(path, os.W_OK):
                raise _fail(path, "permission denied")
            return path
        target = Path(os.path.realpath(path))  # a new file, or the missing target of a link
        if not target.parent.is_dir():
            raise _fail(path, f"folder {printable(path.parent, 160)} does not exist")
        if len(os.fsencode(target.name)) > _name_max(target.parent):
            raise _fail(
                path,
                f"the file name is longer than the {_name_max(target.parent)} bytes this file "
                "system allows; give a shorter name",
            )
        if not os.access(target.parent, os.W_OK | os.X_OK):
            raise _fail(path, f"folder {printable(path.parent, 160)} is not writable")
    except OSError as e:
        raise _fail(path, e.strerror or str(e)) from None
    return path


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def write_text(text: str, path: str | Path) -> Path:
    """Write ``text`` to ``path``: atomically for a regular file or a new path, straight through for a
    device or pipe; :class:`OutputError` if the path is unusable. Returns ``path``."""
    path = check_output_path(path)
    guard_outputs([path])  # never over a file this command has read (its database, suite, space file)
    try:
        mode = _mode(path)
        if mode is not None and not stat.S_ISREG(mode):
            with open(path, "w", encoding="utf-8") as f:  # /dev/stdout, /dev/null, a FIFO: write through
                f.write(text)
            return path
        _replace_atomically(text, Path(os.path.realpath(path)))  # through a link: its target, the link stays
    except OSError as e:
        raise _fail(path, e.strerror or str(e)) from None
    return path


def _replace_atomically(text: str, target: Path) -> None:
    existing_mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else None
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".flashtune-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if existing_mode is None:  # a new file gets the usual permissions, not mkstemp's 0600
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        else:
            os.chmod(tmp, existing_mode)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
