"""The base of every error a user can cause. The command line prints these as one line, never a traceback."""

from __future__ import annotations

__all__ = ["FlashtuneError", "UsageError"]


class FlashtuneError(Exception):
    """Something the user can fix; the message says what was wrong and what to do."""


class UsageError(FlashtuneError, ValueError):
    """Bad input that is not about one module in particular (command-line values, a config, a GPU)."""
