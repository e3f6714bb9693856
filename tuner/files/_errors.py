"""The error an output path gives (its own module: the output checks and the writes both raise it)."""

from __future__ import annotations

from ..errors import FlashtuneError

__all__ = ["OutputError"]


class OutputError(FlashtuneError, ValueError):
    """The output path cannot be written (a directory, a missing folder, a name too long, no permission,
    a file the command reads)."""
