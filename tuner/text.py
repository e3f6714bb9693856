"""Text from users, files and databases made safe to print: one line, no terminal control sequences."""

from __future__ import annotations

__all__ = ["printable"]


def printable(value: object, limit: int | None = 200) -> str:
    """``value`` as one printable line: control and other non-printable characters (escape sequences,
    newlines, bidi overrides) are written as Python escapes (``\\x1b``, ``\\n``, ``\\u202e``); text
    longer than ``limit`` characters is cut with ``...``."""
    text = str(value)
    if not text.isprintable():
        text = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)
    if limit is not None and len(text) > limit:
        text = text[: max(0, limit - 3)] + "..."
    return text
