"""The files a command reads, so that none of its outputs can be one of them.

A command's inputs are of two kinds: those it names before any work (the study database and
its ``-wal``/``-journal``/``-shm`` files, the suite file, a space file: :func:`guard_outputs`
takes them) and those it only comes to read on the way (the space file a stored study names,
a header): :func:`tuner.files.read_limited` notes each file it reads while :func:`inputs_noted`
is active, and :func:`tuner.files.write_text` refuses to write over any of them.

Two paths are the same file when they resolve to the same path (links followed) or, for files
that exist, when they have the same device and inode (a hard link, a bind mount,
``/dev/stdout`` redirected into the database).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..text import printable
from ._errors import OutputError

__all__ = ["Input", "guard_outputs", "inputs_noted", "note_input", "noted_inputs"]


@dataclass(frozen=True)
class Input:
    """A file a command reads: what it is to the command (``the study database``) and its path."""

    what: str
    path: str


_NOTED: contextvars.ContextVar[list[Input] | None] = contextvars.ContextVar("flashtune_inputs", default=None)


@contextlib.contextmanager
def inputs_noted(inputs: Iterable[Input] = ()) -> Iterator[list[Input]]:
    """Inside, every file read through :func:`tuner.files.read_limited` is noted as an input (and
    ``inputs`` from the start); :func:`tuner.files.write_text` refuses to write over any of them."""
    noted = list(inputs)
    token = _NOTED.set(noted)
    try:
        yield noted
    finally:
        _NOTED.reset(token)


def note_input(what: str, path: str | Path) -> None:
    """Note ``path`` as read by the running command (nothing outside :func:`inputs_noted`)."""
    noted = _NOTED.get()
    if noted is not None:
        noted.append(Input(what, str(path)))


def noted_inputs() -> list[Input]:
    """The inputs noted so far by the running command."""
    return list(_NOTED.get() or ())


def _identity(path: str | Path) -> tuple[str, tuple[int, int] | None]:
    """(resolved path, (device, inode) or None where nothing exists)."""
    real = os.path.realpath(path)
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return real, None
    return real, (info.st_dev, info.st_ino)


def _same(a: tuple[str, tuple[int, int] | None], b: tuple[str, tuple[int, int] | None]) -> bool:
    return a[0] == b[0] or (a[1] is not None and a[1] == b[1])


def guard_outputs(outputs: Iterable[str | Path], inputs: Iterable[Input] = ()) -> None:
    """Refuse (:class:`~tuner.files.OutputError`) an output that is the same file as one of ``inputs`` or of
    the inputs noted so far, or as another output."""
    known = [*inputs, *noted_inputs()]
    seen: list[tuple[str, tuple[str, tuple[int, int] | None]]] = []
    for output in outputs:
        out = _identity(output)
        for item in known:
            if _same(out, _identity(item.path)):
                raise OutputError(
                    f"cannot write {printable(output, 160)}: it is {item.what} this command reads "
                    f"({printable(item.path, 160)}); write the output to another file"
                )
        for other, identity in seen:
            if _same(out, identity):
                raise OutputError(
                    f"cannot write {printable(output, 160)}: it is the same file as the other output "
                    f"{printable(other, 160)}; give another -o"
                )
        seen.append((str(output), out))
