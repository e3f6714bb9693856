"""The base of every error a user can cause. The command line prints these as one line, never a traceback."""

from __future__ import annotations

import contextlib
import sys

from .text import printable

__all__ = ["FlashtuneError", "UsageError", "warn"]


class FlashtuneError(Exception):
    """Something the user can fix; the message says what was wrong and what to do."""


class UsageError(FlashtuneError, ValueError):
    """Bad input that is not about one module in particular (command-line values, a config, a GPU)."""


def warn(message: str) -> None:
    """Tell the user of something flashtune works around: one ``flashtune: warning: ...`` line on stderr
    (never Python's two-line warning with a source path)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # stderr closed: nowhere to tell
        print(f"flashtune: warning: {printable(message, 1000)}", file=sys.stderr, flush=True)
