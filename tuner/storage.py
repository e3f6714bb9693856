"""Study storage: SQLAlchemy URLs, the default SQLite file, safe display, clear failures."""

from __future__ import annotations

import sqlite3
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import optuna
from sqlalchemy import event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from .errors import FlashtuneError

__all__ = ["DEFAULT_STORAGE", "StorageError", "mask_url", "open_storage", "retrying", "set_trial_user_attrs"]

T = TypeVar("T")

DEFAULT_STORAGE = "sqlite:///studies/flashtune.db"


class StorageError(FlashtuneError, RuntimeError):
    """The storage URL is malformed, unreachable, or points at something that is not an Optuna database."""


_SECRET_QUERY_KEYS = ("password", "passfile", "sslpassword")  # libpq/psycopg also take these as URL query keys


def mask_url(url: str) -> str:
    """The URL with any password (``user:pw@`` or ``?password=pw``) replaced by ``***``, for logs,
    reports and headers."""
    try:
        parsed = make_url(url)
        secret = {k: "***" for k in parsed.query if k.lower() in _SECRET_QUERY_KEYS}
        return parsed.update_query_dict(secret).render_as_string(hide_password=True).replace("%2A%2A%2A", "***")
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


def open_storage(url: str | None = None, *, create: bool = True) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage for ``url`` (default :data:`DEFAULT_STORAGE`), or a :class:`StorageError`.

    Heartbeats are on (see :mod:`tuner.heartbeat`): a trial whose tuner died is failed and
    re-enqueued by whichever tuner notices first. Commands that only read (``create=False``)
    refuse a SQLite path where no database exists instead of creating an empty one.
    """
    from .heartbeat import GRACE_PERIOD_S, HEARTBEAT_INTERVAL_S, requeue_stale

    url = url or DEFAULT_STORAGE
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise StorageError(f"invalid storage URL {url!r}; expected e.g. {DEFAULT_STORAGE} or "
                           "postgresql+psycopg://user:password@host/db") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        if not create and not Path(parsed.database).is_file():
            raise StorageError(f"no study database at {parsed.database}; run `flashtune tune` first, or point "
                               "--storage at the database that holds your studies")
        _check_sqlite_file(parsed.database)
    if parsed.get_backend_name() == "sqlite":  # wait for the write lock (heartbeat thread, other tuners)
        engine_kwargs: dict = {"connect_args": {"timeout": 60}}
    else:
        engine_kwargs = {"pool_pre_ping": True}
    try:
        with warnings.catch_warnings():  # heartbeats are on on purpose: no "experimental feature" line on stderr
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs,
                                                 heartbeat_interval=HEARTBEAT_INTERVAL_S, grace_period=GRACE_PERIOD_S,
                                                 heartbeat_stale_trial_callback=requeue_stale)
    except (SQLAlchemyError, ImportError, ValueError, RuntimeError) as e:
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        if parsed.password:
            reason = reason.replace(str(parsed.password), "***")
        raise StorageError(f"cannot open storage {mask_url(url)}: {reason}") from None
    if parsed.get_backend_name() == "sqlite":
        _lock_sqlite_at_begin(storage.engine)
    return storage


def _lock_sqlite_at_begin(engine: Engine) -> None:
    """Make every SQLite transaction take the write lock when it begins.

    pysqlite only begins a transaction at the first write, after the reads that decided it, so
    two tuners could both read an enqueued trial as WAITING and both run it (PostgreSQL locks
    the row: ``SELECT ... FOR UPDATE``). ``BEGIN IMMEDIATE`` serialises the transactions
    instead; they are short, and waiting ones queue for up to the connection's timeout.
    """
    @event.listens_for(engine, "connect")
    def _driver_leaves_transactions_to_sqlalchemy(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None
        # write-ahead log: a commit appends to the log instead of syncing the database file, and
        # readers do not wait for writers. With synchronous=NORMAL a power cut may lose the last
        # commits (never corrupts); a crash of the tuner loses nothing. A trial costs ~10 commits.
        dbapi_connection.execute("PRAGMA journal_mode=WAL")
        dbapi_connection.execute("PRAGMA synchronous=NORMAL")

    @event.listens_for(engine, "begin")
    def _begin_immediate(connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections opened while the tables were created predate the listeners


def retrying(call: Callable[[], T], *, what: str, attempts: int = 6, first_delay_s: float = 1.0,
             log=None) -> T:
    """Run a storage operation; while the database is unreachable, retry with doubling delays.

    Says so on stderr at each retry; after ``attempts`` tries raises :class:`StorageError` (what
    was stored stays stored: rerunning the same command resumes).
    """
    delay = first_delay_s
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
            if attempt == attempts:
                raise StorageError(f"storage unreachable while {what} after {attempts} attempts ({reason}); "
                                   "finished trials are stored: rerun the same command to resume") from None
            print(f"flashtune: storage unreachable while {what} ({reason}); retry {attempt}/{attempts - 1} "
                  f"in {delay:.0f} s", file=log or sys.stderr, flush=True)
            time.sleep(delay)
            delay = min(2 * delay, 30.0)
    raise AssertionError("unreachable")


def set_trial_user_attrs(storage: optuna.storages.BaseStorage, trial_id: int, attrs: dict[str, object]) -> None:
    """Set several user attributes of a RUNNING trial in one transaction where the storage is Optuna's
    RDB storage (a trial's outcome is five or six attributes: one commit instead of one each), else one
    call each. Either way the attributes are stored exactly as ``Trial.set_user_attr`` stores them."""
    backend = getattr(storage, "_backend", storage)  # the study's storage caches in front of the RDB one
    try:
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        write = backend._set_trial_attr_without_commit  # type: ignore[attr-defined]
        session_of = backend.scoped_session  # type: ignore[attr-defined]
    except (AttributeError, ImportError):  # another storage, or an Optuna without these internals
        for key, value in attrs.items():
            storage.set_trial_user_attr(trial_id, key, value)
        return
    with _create_scoped_session(session_of, True) as session:
        for key, value in attrs.items():
            write(session, models.TrialUserAttributeModel, trial_id, key, value)
