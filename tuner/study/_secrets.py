"""Storage URLs in messages without their passwords.

:func:`mask_url` hides a URL's password without trusting the URL to parse; every password of a
storage URL that passes through :mod:`tuner.study` is remembered, and :func:`redact` takes them
all out of any text (the command line applies it to every line it prints on failure).
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from sqlalchemy.engine import make_url

from ..text import printable

__all__ = ["mask_text", "mask_url", "redact", "remember_secrets"]

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://(.*)", re.S)
_SECRET_QUERY = re.compile(r"([?&;](?:password|passfile|sslpassword)=)([^&;#]*)", re.I)
_SECRETS: set[str] = set()  # every password seen in a storage URL by this process (for redact)


def _userinfo_secret(scheme: str | None, rest: str) -> tuple[str, str] | None:
    """(text before the secret, the secret) of ``user:secret@host...``; the secret runs to the last ``@``,
    so an unescaped ``@`` in a password does not leave its tail in view."""
    at = rest.rfind("@")
    if at < 0:
        return None
    userinfo = rest[:at]
    if ":" not in userinfo or (scheme is not None and scheme.lower().startswith("sqlite") and userinfo.startswith("/")):
        return None
    user, _, secret = userinfo.partition(":")
    return user, secret


def _secrets_of(url: str) -> set[str]:
    """Every form a password of ``url`` may take in a message: as written, percent-decoded, as SQLAlchemy parsed it."""
    found: set[str] = set()
    m = _SCHEME.fullmatch(url)
    pair = _userinfo_secret(m.group(1) if m else None, m.group(2) if m else url)
    if pair:
        found.add(pair[1])
        found.update(pair[1].split("@"))  # a driver may quote the tail it took for the host name
    found.update(v for _, v in _SECRET_QUERY.findall(url))
    try:
        parsed = make_url(url)
        if parsed.password:
            found.add(str(parsed.password))
        found.update(str(v) for k, v in parsed.query.items() if k.lower() in ("password", "passfile", "sslpassword"))
    except Exception:
        pass
    found |= {unquote(s) for s in found}
    return {s for s in found if s}


def remember_secrets(url: str) -> None:
    """Keep the passwords of ``url`` for :func:`redact`."""
    _SECRETS.update(_secrets_of(url))


def redact(text: str, *urls: str) -> str:
    """``text`` with every password of ``urls`` and of every storage URL seen so far replaced by ``***``."""
    for url in urls:
        remember_secrets(url)
    for secret in sorted(_SECRETS, key=len, reverse=True):
        if len(secret) >= 3 or any(secret in u for u in urls):  # a one-letter password would garble the text
            text = text.replace(secret, "***")
    return text


def mask_text(text: str) -> str:
    """Any text that may hold a URL, with ``user:secret@`` (up to the last ``@``) and ``?password=`` masked;
    needs no parsing, so a URL that SQLAlchemy refuses is masked too."""
    m = _SCHEME.fullmatch(text)
    scheme, rest = (m.group(1), m.group(2)) if m else (None, text)
    pair = _userinfo_secret(scheme, rest)
    if pair:
        rest = f"{pair[0]}:***{rest[rest.rfind('@') :]}"
    text = f"{scheme}://{rest}" if scheme is not None else rest
    return printable(_SECRET_QUERY.sub(r"\1***", text), limit=300)


def mask_url(url: str) -> str:
    """The URL with any password (``user:pw@``, ``?password=pw``) replaced by ``***``, for logs, reports
    and headers; ``<unparsable storage URL>`` for text that is no URL."""
    text = str(url)
    remember_secrets(text)
    try:
        parsed = make_url(text)
        secret = {k: "***" for k in parsed.query if k.lower() in ("password", "passfile", "sslpassword")}
        shown = parsed.update_query_dict(secret).render_as_string(hide_password=True).replace("%2A%2A%2A", "***")
    except Exception:
        return "<unparsable storage URL>"
    m = _SCHEME.fullmatch(text)
    pair = _userinfo_secret(m.group(1), m.group(2)) if m else None
    if pair and "@" in pair[1]:  # an unescaped "@" in the password: SQLAlchemy took its tail for the host
        return mask_text(text)
    return printable(shown, limit=300)
