"""``flashtune``: :func:`main` parses the command line, runs the command and turns every failure into one
line on standard error and an exit status (2: bad input or a failed storage, 1: an internal error)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator, Sequence

from ..errors import FlashtuneError
from ..files import inputs_noted
from ..text import printable
from ._parser import build_parser
from ._process import command_process, stopped_by

__all__ = ["build_parser", "main"]


def _error(command: str, message: str) -> None:
    """The one line a failed command prints: passwords of every storage URL seen redacted, control
    characters escaped, nothing that could look like a second line."""
    from ..study import redact

    with contextlib.suppress(BrokenPipeError, OSError):
        print(f"flashtune {command}: error: {printable(redact(message), 2000)}", file=sys.stderr, flush=True)


def _stdout_gone() -> None:
    """stdout's reader left (``flashtune best --json | head -1``): stop writing to it, quietly."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


@contextlib.contextmanager
def _use_kernels(kernels: list[str] | None) -> Iterator[None]:
    """``--kernels``: checked, then put first on ``$FLASHTUNE_KERNELS`` while the command runs: every family
    lookup reads it, and the compile and GPU worker processes the command starts inherit it."""
    if not kernels:
        yield
        return
    from ..space import KERNELS_ENV, kernel_dirs

    dirs = kernel_dirs(kernels)  # a directory that is not one is refused here, by name
    before = os.environ.get(KERNELS_ENV)
    os.environ[KERNELS_ENV] = os.pathsep.join([*map(str, dirs), *([before] if before else [])])
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(KERNELS_ENV, None)
        else:
            os.environ[KERNELS_ENV] = before


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command
    with command_process():
        return _run(command, args)


def _run(command: str, args) -> int:
    """The command's exit status, every failure turned into one line."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    from ..progress import configure_logging
    from ..study import error_reason

    configure_logging(args.verbose - args.quiet)
    try:
        with _use_kernels(getattr(args, "kernels", None)), inputs_noted():  # no output may replace an input
            rc = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handlers below, not at exit
        return rc
    except BrokenPipeError:
        _stdout_gone()
        return 141  # 128 + SIGPIPE, as a shell reports a process killed by it
    except FlashtuneError as e:
        _error(command, str(e))
        return 2
    except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:
        _error(
            command,
            f"the storage failed: {error_reason(e)}; check that --storage points at a healthy "
            "study database (finished trials stay stored) and rerun",
        )
        return 2
    except KeyboardInterrupt:
        signum = stopped_by()
        how = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
        with contextlib.suppress(OSError):
            print(f"flashtune {command}: {how}; finished trials are stored", file=sys.stderr)
        return 128 + signum
    except MemoryError:
        _error(command, "out of memory")
        return 1
    except Exception as e:
        if os.environ.get("FLASHTUNE_DEBUG"):
            raise
        _error(
            command,
            f"internal error ({type(e).__name__}: {e}); rerun with FLASHTUNE_DEBUG=1 for the "
            "traceback, and please report it",
        )
        return 1
