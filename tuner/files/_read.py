"""The content of small files that may change while a process runs, read again only when they change.

``tuner.attention`` keys its launch cache on the content of the space file and of a config
header (or dispatch JSON), so an edited file never serves a stale config, and it must not
read them on every call. :func:`read_content` stats the file (one system call) and returns
the remembered digest and bytes while the file's identity, size and times are unchanged.

A file modified within :data:`RACY_NS` of being read is "racy" (as in git's index): a second
edit in the same timestamp tick, of the same size, would leave the stat unchanged, so such a
file is read again on every lookup until its timestamps are old enough.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
import tomllib

from ..errors import FlashtuneError
from ..text import printable
from ._inputs import note_input

__all__ = ["MAX_TEXT_BYTES", "RACY_NS", "FileContentError", "read_content", "read_limited", "read_toml"]

#: the largest space or suite file read (the largest shipped is a few KiB)
MAX_TEXT_BYTES = 1 << 20

#: a file whose mtime or ctime is this recent when read is read again at the next lookup
RACY_NS = 2_000_000_000

# path as given -> (stat signature, digest, data, racy)
_memo: dict[str, tuple[tuple[int, ...], str, bytes, bool]] = {}


class FileContentError(FlashtuneError, ValueError):
    """The file cannot be read as a small regular file (missing, a device, a folder, too large), or its
    text is not what it should be (not UTF-8, not TOML). ``missing``: there is no such file."""

    def __init__(self, message: str, *, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


def read_limited(path: str | os.PathLike, limit_bytes: int, *, what: str = "a file") -> tuple[os.stat_result, bytes]:
    """(stat taken before reading, content) of a regular file of at most ``limit_bytes``: never a FIFO,
    a device or a folder, so a read neither blocks nor runs on without end. Every file flashtune is
    handed is read through here; ``what`` names it as an input of the running command."""
    path = os.fspath(path)
    note_input(what, path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO must not block the open
    except OSError as e:
        raise FileContentError(
            f"cannot read {printable(path, 200)}: {e.strerror or e}", missing=isinstance(e, FileNotFoundError)
        ) from None
    except ValueError:  # a NUL byte in the name
        raise FileContentError(f"cannot read {printable(path, 200)}: the name holds a NUL byte") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileContentError(
                f"cannot read {printable(path, 200)}: not a regular file (a folder, device or pipe); give a file"
            )
        if info.st_size > limit_bytes:
            raise FileContentError(
                f"cannot read {printable(path, 200)}: {info.st_size} bytes is more than the {limit_bytes} "
                "bytes such a file can have"
            )
        chunks, size = [], 0
        while size <= limit_bytes:
            chunk = os.read(fd, limit_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit_bytes:  # grew while being read
            raise FileContentError(f"cannot read {printable(path, 200)}: more than {limit_bytes} bytes")
        return info, b"".join(chunks)
    except OSError as e:
        raise FileContentError(f"cannot read {printable(path, 200)}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def _signature(info: os.stat_result) -> tuple[int, ...]:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def read_content(path: str, *, limit_bytes: int = 1 << 20) -> tuple[str, bytes]:
    """(sha256 hex digest, bytes) of the file at ``path``; from memory while the file is unchanged.

    Raises :class:`FileContentError` when it cannot be read.
    """
    try:
        signature = _signature(os.stat(path))
    except OSError as e:
        _memo.pop(path, None)
        raise FileContentError(f"cannot read {path}: {e.strerror or e}") from None
    entry = _memo.get(path)
    if entry is not None and entry[0] == signature and not entry[3]:
        return entry[1], entry[2]
    info, data = read_limited(path, limit_bytes)
    digest = hashlib.sha256(data).hexdigest()
    racy = time.time_ns() - max(info.st_mtime_ns, info.st_ctime_ns) < RACY_NS
    _memo[path] = (_signature(info), digest, data, racy)
    return digest, data


def read_toml(path: str | os.PathLike, *, what: str) -> dict:
    """The TOML table of a small text file (``what``: ``the space file``), read by :func:`read_limited`;
    :class:`FileContentError` with ``path: reason`` when it cannot be read or is not TOML."""
    shown = printable(os.fspath(path), 200)
    _, data = read_limited(path, MAX_TEXT_BYTES, what=what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileContentError(f"{shown}: not UTF-8 text (byte {e.start}); save {what} as UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise FileContentError(f"{shown}: not valid TOML: {e}") from None
    except RecursionError:
        raise FileContentError(f"{shown}: not valid TOML: nested too deeply; flatten its tables and arrays") from None
