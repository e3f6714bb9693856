"""Study storage: SQLAlchemy URLs, the default SQLite file, safe display, clear failures."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import optuna
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from .errors import FlashtuneError

__all__ = ["DEFAULT_STORAGE", "StorageError", "mask_url", "open_storage"]

DEFAULT_STORAGE = "sqlite:///studies/flashtune.db"


class StorageError(FlashtuneError, RuntimeError):
    """The storage URL is malformed, unreachable, or points at something that is not an Optuna database."""


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***``, for logs, reports and headers."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "<unparsable storage URL>"


def _check_sqlite_file(database: str) -> None:
    """Create the folder of a SQLite file; refuse a file that belongs to another program."""
    path = Path(database)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.stat().st_size == 0:
        return
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as e:
        raise StorageError(f"{path} is not a SQLite database ({e}); choose another --storage") from None
    if tables and "studies" not in tables:
        raise StorageError(f"{path} holds another program's tables ({', '.join(sorted(tables)[:5])}), "
                           "not an Optuna study database; choose another --storage")


def open_storage(url: str | None = None, *, heartbeat_interval: int | None = None) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage for ``url`` (default :data:`DEFAULT_STORAGE`), or a :class:`StorageError`."""
    url = url or DEFAULT_STORAGE
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise StorageError(f"invalid storage URL {url!r}; expected e.g. {DEFAULT_STORAGE} or "
                           "postgresql+psycopg://user:password@host/db") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        _check_sqlite_file(parsed.database)
    engine_kwargs = {"pool_pre_ping": True} if parsed.get_backend_name() != "sqlite" else {}
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_interval)
    except (SQLAlchemyError, ImportError, ValueError, RuntimeError) as e:
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        if parsed.password:
            reason = reason.replace(str(parsed.password), "***")
        raise StorageError(f"cannot open storage {mask_url(url)}: {reason}") from None

