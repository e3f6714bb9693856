"""What a command's process needs around it: standard streams that cannot fail unreported, and SIGTERM
and SIGHUP stopping a command as Ctrl-C does.

- A closed standard stream (``>&-``) is replaced by ``/dev/null`` at its file descriptor, so that no
  file the command opens (the study database) takes descriptor 1 and receives its output; writing to
  a closed or full standard output (``> /dev/full``) raises :class:`~tuner.files.OutputError`, one line.
- SIGTERM (``docker stop``, Slurm, ``timeout``) and SIGHUP raise :class:`KeyboardInterrupt` in the main
  thread, so a run stops on the path Ctrl-C takes: trials in flight failed and re-queued, the GPU and
  compile processes reaped.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from ..files import OutputError

__all__ = ["STOP_SIGNALS", "command_process", "stopped_by"]

#: the signals that stop a command as Ctrl-C does
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))

_received: list[int] = []


def stopped_by() -> int:
    """The signal that stopped the command (SIGINT when Ctrl-C or none of :data:`STOP_SIGNALS`)."""
    return _received[-1] if _received else signal.SIGINT


def _interrupt(signum: int, _frame: Any) -> None:
    _received.append(signum)
    raise KeyboardInterrupt


class _CheckedStdout:
    """Standard output whose failures (closed, file system full, I/O error) are one :class:`OutputError`;
    a reader that left (:class:`BrokenPipeError`) stays what it is."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _failed(self, e: OSError | ValueError | AttributeError) -> OutputError:
        _discard_stdout()
        why = e.strerror if isinstance(e, OSError) and e.strerror else "it is closed"
        return OutputError(f"cannot write to standard output: {why}; redirect it to a file that can take the output")

    def write(self, text: str) -> int:
        if self._stream is None:
            raise self._failed(ValueError())
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as e:
            raise self._failed(e) from None

    def flush(self) -> None:
        if self._stream is None:
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as e:
            raise self._failed(e) from None

    def isatty(self) -> bool:
        return bool(self._stream is not None and self._stream.isatty())

    def __getattr__(self, name: str) -> Any:
        if self._stream is None:
            raise AttributeError(name)
        return getattr(self._stream, name)


def _discard_stdout() -> None:
    """Point descriptor 1 at /dev/null: what is still buffered for a stdout that failed goes nowhere, and
    the interpreter's last flush at exit does not fail again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        if devnull != 1:
            os.dup2(devnull, 1)
            os.close(devnull)


def _occupy_closed_descriptors() -> bool:
    """Open /dev/null at descriptors 0-2 where they are closed; True when standard output was closed."""
    stdout_closed = False
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError as e:
            if e.errno != errno.EBADF:
                continue
            opened = os.open(os.devnull, os.O_RDWR)
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)
            stdout_closed |= fd == 1
    return stdout_closed


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker now, with the stop signals ignored: it ignores SIGTERM
    itself but not SIGHUP, and a SIGHUP sent to the process group (a closed terminal) killed it, so
    that it was started again with a traceback per semaphore. Ignored signals stay ignored across
    exec; the command's own handlers are set after."""
    from multiprocessing import resource_tracker

    saved = {signum: signal.signal(signum, signal.SIG_IGN) for signum in STOP_SIGNALS}
    try:
        resource_tracker.ensure_running()
    except (OSError, ValueError):  # no processes can be started: the command says so when it needs one
        pass
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def command_process() -> Iterator[None]:
    """Run a command with checked standard output and SIGTERM/SIGHUP as Ctrl-C (restored on leaving)."""
    stdout_closed = _occupy_closed_descriptors() or sys.stdout is None
    saved_stdout = sys.stdout
    sys.stdout = _CheckedStdout(None if stdout_closed else saved_stdout)
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        _received.clear()
        _start_resource_tracker()
        for signum in STOP_SIGNALS:
            previous[signum] = signal.signal(signum, _interrupt)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sys.stdout = saved_stdout
