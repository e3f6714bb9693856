"""Study storage: SQLAlchemy URLs, the default SQLite file, checks before anything is written, clear
failures, and retries while a database is unreachable.

:func:`open_storage` opens a :class:`~tuner.study.FlashtuneStorage` with heartbeats on; every URL
that passes through here leaves its passwords with :mod:`tuner.study`'s redaction, so no message
shows them.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import random
import sqlite3
import stat
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import optuna
from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    DisconnectionError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from ..errors import FlashtuneError
from ..text import printable
from ._heartbeat import GRACE_PERIOD_S, HEARTBEAT_INTERVAL_S, requeue_stale
from ._optuna_storage import FlashtuneStorage
from ._secrets import mask_text, mask_url, redact, remember_secrets

__all__ = [
    "DEFAULT_STORAGE",
    "StaleTrialCallback",
    "StorageError",
    "check_storage",
    "error_reason",
    "is_transient",
    "open_storage",
    "reading",
    "retrying",
    "sqlite_files",
]

T = TypeVar("T")

DEFAULT_STORAGE = "sqlite:///studies/flashtune.db"

#: what a storage calls for a RUNNING trial that it has just failed as stale (see :func:`tuner.study.recover_stale`)
StaleTrialCallback = Callable[[optuna.Study, optuna.trial.FrozenTrial], None]


class StorageError(FlashtuneError, RuntimeError):
    """The storage URL is malformed, unreachable, or points at something that is not an Optuna database."""


# -- reasons -----------------------------------------------------------------------------------
def error_reason(e: BaseException) -> str:
    """The first line of what the database driver said (Optuna's StorageInternalError hides it behind a
    generic "e.g. exceeding max length"; SQLAlchemy adds its statement and parameters), passwords redacted."""
    inner: BaseException = e
    for _ in range(8):
        if isinstance(inner, DBAPIError) and inner.orig is not None:
            inner = inner.orig
            break
        nxt = inner.__cause__ or (
            inner.__context__ if isinstance(inner, optuna.exceptions.StorageInternalError) else None
        )
        if nxt is None:
            break
        inner = nxt
    lines = [line.strip() for line in str(inner).strip().splitlines() if line.strip()]
    text = lines[0] if lines else type(inner).__name__
    if text.startswith("(") and ") " in text:  # "(sqlite3.OperationalError) database is locked"
        text = text.split(") ", 1)[1]
    return printable(redact(text), limit=200)


_TRANSIENT = (OperationalError, InterfaceError, DisconnectionError, PoolTimeoutError)


def is_transient(e: BaseException) -> bool:
    """Whether a storage failure may pass (connection lost, server restarting, database locked), so
    retrying makes sense; a malformed database or a constraint violation will not."""
    for _ in range(8):
        if isinstance(e, _TRANSIENT):
            return True
        if isinstance(e, optuna.exceptions.StorageInternalError) and e.__cause__ is not None:
            e = e.__cause__
            continue
        return False
    return False


# -- SQLite files ------------------------------------------------------------------------------
def _optuna_tables() -> frozenset[str]:
    """Optuna's tables, and the one its schema migrations keep their version in."""
    return frozenset(FlashtuneStorage.table_columns()) | {"alembic_version"}


_CORE_TABLES = frozenset({"studies", "trials", "version_info"})
_NO_DATABASE = "run `flashtune tune` first, or point --storage at the database that holds your studies"


def _sqlite_path(parsed: URL, url: str) -> Path:
    database = parsed.database or ""
    in_memory = (
        not database
        or database == ":memory:"
        or database.startswith("file::memory:")
        or parsed.query.get("mode") == "memory"
    )
    if in_memory:
        raise StorageError(
            f"{mask_url(url)} is an in-memory SQLite database: every process would see its own, "
            "empty one; give a file, e.g. sqlite:///studies/flashtune.db"
        )
    if parsed.query or database.startswith("file:"):
        # a SQLite URI filename (file:...?uri=true, ?mode=, ?vfs=, ?immutable=) names another file than the
        # path flashtune checks, and changes how it is opened: refused rather than resolved
        raise StorageError(
            f"{mask_url(url)}: SQLite URL options and file: URIs are not supported; give the database's "
            "path, e.g. sqlite:///studies/flashtune.db or sqlite:////abs/path/flashtune.db"
        )
    return Path(database)


#: seconds a command waits for a SQLite database another process holds locked (a backup, the sqlite3
#: shell, another tuner's write), as long as the tuner waits for its write lock
LOCK_WAIT_S = 60.0
_SQLITE_READONLY_ROLLBACK = 776  # a read-only connection found a hot journal it may not roll back


def _read_only_uri(path: Path) -> str:
    """The URI that opens the SQLite file at ``path`` read-only (``as_uri`` quotes '#', '?' and '%')."""
    return path.absolute().as_uri() + "?mode=ro"


def _connect_read_only(path: str) -> sqlite3.Connection:
    """A read-only connection to the SQLite file ``path`` (the engine of a reading command makes its
    connections here: it can neither create tables nor change a byte of the database)."""
    return sqlite3.connect(_read_only_uri(Path(path)), uri=True, timeout=LOCK_WAIT_S, check_same_thread=False)


def sqlite_files(url: str | None) -> tuple[Path, ...]:
    """The files of a SQLite storage URL: the database and its ``-wal``, ``-journal`` and ``-shm`` beside it
    (whether they exist or not); none for a database server or a URL that is no SQLite file."""
    try:
        url, parsed, backend = _parse(url)
        if backend != "sqlite":
            return ()
        path = _sqlite_path(parsed, url)
    except StorageError:
        return ()
    return (path, *(Path(f"{path}{suffix}") for suffix in ("-wal", "-journal", "-shm")))


def _sqlite_tables(path: Path, *, writable: bool = False) -> dict[str, set[str]]:
    """The tables of an existing SQLite file and their columns, read without writing anything (not even a
    journal); ``writable``: through a read-write connection, which rolls back a hot journal first."""
    try:
        conn = sqlite3.connect(str(path), timeout=LOCK_WAIT_S) if writable else _connect_read_only(str(path))
        try:
            names = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            return {
                n: {row[1] for row in conn.execute(f'PRAGMA table_info("{n.replace(chr(34), chr(34) * 2)}")')}
                for n in names
            }
        finally:
            conn.close()
    except sqlite3.DatabaseError as e:
        raise _sqlite_failure(path, e) from None


def _sqlite_failure(path: Path, e: sqlite3.DatabaseError) -> StorageError:
    """What a failed look into a SQLite file means: locked by another process, a hot journal to roll
    back, or not a SQLite database."""
    shown = printable(path, limit=300)
    name = getattr(e, "sqlite_errorname", "")
    if name in ("SQLITE_BUSY", "SQLITE_LOCKED") or "locked" in str(e):
        return StorageError(
            f"{shown} is locked by another process (a backup, the sqlite3 shell, a tuner's long write) and "
            f"stayed locked for {LOCK_WAIT_S:g} s; rerun once it lets go"
        )
    if getattr(e, "sqlite_errorcode", None) == _SQLITE_READONLY_ROLLBACK:
        return StorageError(
            f"{shown} has a hot journal ({shown}-journal: a writer stopped mid-transaction); the database "
            "is intact but its next writer must roll the journal back: run `flashtune tune` on it (or "
            f"`sqlite3 {shown} 'PRAGMA quick_check'`), then rerun"
        )
    return StorageError(f"{shown} is not a SQLite database ({e}); choose another --storage")


def _check_sqlite_file(path: Path, *, create: bool, dry_run: bool = False) -> None:
    """Refuse a path that is not a usable study database: another program's file, a directory or device,
    an unwritable place (for commands that write), or, for commands that only read, one with no studies.
    ``dry_run``: check a path a command will write, creating nothing yet (not even its folder)."""
    shown = printable(path, limit=300)
    try:
        if not create and not path.is_file():
            if path.exists():
                raise StorageError(f"{shown} is not a regular file; point --storage at a study database")
            raise StorageError(f"no study database at {shown}; {_NO_DATABASE}")
        if path.exists():
            mode = path.stat().st_mode
            if stat.S_ISDIR(mode):
                raise StorageError(f"{shown} is a directory; give a database file, e.g. sqlite:///{shown}/flashtune.db")
            if not stat.S_ISREG(mode):
                raise StorageError(f"{shown} is not a regular file (a device, pipe or socket); give a database file")
            size = path.stat().st_size
        else:
            size = None
    except OSError as e:
        raise StorageError(f"cannot use {shown}: {e.strerror or e}; choose another --storage") from None
    try:
        columns = _sqlite_tables(path, writable=create and not dry_run) if size else {}
    except StorageError:
        if dry_run and Path(f"{path}-journal").exists():
            return  # a hot journal: the read-write open that follows rolls it back, then checks the tables
        raise
    tables = set(columns)
    foreign = {t for t in tables - _optuna_tables() if not t.startswith("sqlite_")}
    # Optuna's tables with Optuna's columns but some tables still missing: another tuner is creating the
    # schema right now (it completes it, or this one does); a same-named table of other columns is not Optuna's
    optuna_columns = FlashtuneStorage.table_columns()
    foreign |= {t for t in tables & optuna_columns.keys() if not optuna_columns[t] <= columns[t]}
    if foreign or (tables and not tables >= _CORE_TABLES and not tables & optuna_columns.keys()):
        listed = ", ".join(printable(t, 40) for t in sorted(foreign or tables)[:5])
        raise StorageError(
            f"{shown} holds another program's tables ({listed}), not an Optuna study database; choose another --storage"
        )
    if not create:
        if not tables:
            raise StorageError(f"no study database at {shown} (the file holds no studies); {_NO_DATABASE}")
        _require_complete(shown, tables, _sqlite_schema_rows(path) if tables >= _optuna_tables() else (0, 0))
        return
    if dry_run:
        _check_creatable(path, size)
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StorageError(
            f"cannot create folder {printable(path.parent, 300)} for the study database: "
            f"{e.strerror or e}; choose another --storage"
        ) from None
    if size is not None and not os.access(path, os.W_OK):
        raise StorageError(f"{shown} is read-only; tuning writes to it: make it writable or choose another --storage")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise StorageError(
            f"folder {printable(path.parent, 300)} is not writable (SQLite writes its journal there); "
            "choose another --storage"
        )


def _check_creatable(path: Path, size: int | None) -> None:
    """The folders to create (if any) and the file can be created and written by this process."""
    if size is not None:
        if not os.access(path, os.W_OK):
            raise StorageError(
                f"{printable(path, 300)} is read-only; tuning writes to it: make it writable or "
                "choose another --storage"
            )
        folder = path.parent
    else:
        folder = path.parent.absolute()
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
    try:
        is_dir = folder.is_dir()
    except OSError as e:
        raise StorageError(f"cannot use {printable(path, 300)}: {e.strerror or e}; choose another --storage") from None
    if not is_dir:
        raise StorageError(
            f"cannot create {printable(path, 300)}: {printable(folder, 300)} is not a folder; choose another --storage"
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        raise StorageError(
            f"folder {printable(folder, 300)} is not writable (the study database and its journal "
            "go there); choose another --storage"
        )


def _require_complete(shown: str, tables: set[str], rows: tuple[int, int]) -> None:
    """For commands that only read: refuse a database whose Optuna schema is incomplete (some tables, the
    schema version or its revision missing), where opening it would make Optuna write the rest."""
    missing = sorted(_optuna_tables() - tables)
    if missing or not all(rows):
        what = f"tables {', '.join(missing[:5])}" if missing else "its schema version"
        raise StorageError(
            f"{shown} lacks Optuna's {what} (an older Optuna made it, or its first run stopped early); "
            "reading commands change nothing: `flashtune tune` on it completes the schema, then rerun"
        )


_SCHEMA_ROWS = "SELECT (SELECT count(*) FROM version_info), (SELECT count(*) FROM alembic_version)"


def _sqlite_schema_rows(path: Path) -> tuple[int, int]:
    """(rows of version_info, rows of alembic_version), with both tables there: Optuna writes them when empty."""
    try:
        conn = _connect_read_only(str(path))
        try:
            version, revision = conn.execute(_SCHEMA_ROWS).fetchone()
            return version, revision
        finally:
            conn.close()
    except sqlite3.DatabaseError as e:
        raise _sqlite_failure(path, e) from None


def _require_schema(url: str, engine_kwargs: dict[str, Any]) -> None:
    """For commands that only read a server database: refuse one without Optuna's complete schema rather
    than letting Optuna create it."""
    engine = create_engine(url, **engine_kwargs)
    try:
        tables = set(inspect(engine).get_table_names())
        if not tables >= _CORE_TABLES:
            raise StorageError(f"no study database at {mask_url(url)} (it holds no Optuna tables); {_NO_DATABASE}")
        rows = (0, 0)
        if tables >= _optuna_tables():
            with engine.connect() as conn:
                version, revision = conn.exec_driver_sql(_SCHEMA_ROWS).one()
                rows = (version, revision)
    finally:
        engine.dispose()
    _require_complete(mask_url(url), tables, rows)


# -- opening -----------------------------------------------------------------------------------
def _parse(url: str | None) -> tuple[str, URL, str]:
    url = DEFAULT_STORAGE if url is None else url
    if not isinstance(url, str) or not url.strip():
        raise StorageError(
            f"empty storage URL; give e.g. {DEFAULT_STORAGE} or postgresql+psycopg://user:password@host/db"
        )
    remember_secrets(url)
    try:
        parsed = make_url(url)
        return url, parsed, parsed.get_backend_name()
    except (ArgumentError, ValueError, TypeError):
        raise StorageError(
            f"invalid storage URL {mask_text(url)!r}; expected e.g. {DEFAULT_STORAGE} or "
            "postgresql+psycopg://user:password@host/db"
        ) from None


def check_storage(url: str | None) -> None:
    """Check ``url`` as :func:`open_storage` would before writing, creating and changing nothing: a command
    checks its storage before it looks for a GPU, and creates the database only once it has one."""
    url, parsed, backend = _parse(url)
    if backend == "sqlite":
        _check_sqlite_file(_sqlite_path(parsed, url), create=True, dry_run=True)
        return
    try:
        engine = create_engine(url, pool_pre_ping=True)
        try:
            with engine.connect():
                pass
        finally:
            engine.dispose()
    except (SQLAlchemyError, ImportError, ValueError, RuntimeError, OSError) as e:
        raise StorageError(f"cannot open storage {mask_url(url)}: {error_reason(e)}") from None


def _creation_race(e: BaseException) -> bool:
    """Two processes creating the same new database at once: one loses a CREATE TABLE or an INSERT of
    the schema version; opening again finds what the other one made."""
    text = str(e).lower()
    return (
        isinstance(e, IntegrityError)
        or "already exists" in text
        or "unique constraint" in text
        or (
            isinstance(e, optuna.exceptions.StorageInternalError)
            and e.__cause__ is not None
            and _creation_race(e.__cause__)
        )
    )


def _engine_kwargs(url: str, parsed: URL, backend: str, *, create: bool, read_only: bool) -> dict[str, Any]:
    """The engine's arguments, a SQLite file checked first: its connections wait for the write lock
    (heartbeats, other tuners), or are read-only for a reading command."""
    if backend != "sqlite":
        return {"pool_pre_ping": True}
    path = _sqlite_path(parsed, url)
    _check_sqlite_file(path, create=create)
    if read_only:
        return {"creator": functools.partial(_connect_read_only, str(path))}
    return {"connect_args": {"timeout": LOCK_WAIT_S}}


def open_storage(
    url: str | None = None,
    *,
    create: bool = True,
    read_only: bool | None = None,
    stale_trial_callback: StaleTrialCallback | None = None,
) -> FlashtuneStorage:
    """Flashtune's Optuna RDB storage for ``url`` (default :data:`DEFAULT_STORAGE`), or a :class:`StorageError`.

    Heartbeats are on (see :func:`tuner.study.recover_stale`); a trial whose tuner died is failed by
    whichever tuner notices first, which then calls ``stale_trial_callback`` (default: re-enqueue its
    config, :func:`tuner.study.requeue_stale`). Commands that only read (``create=False``) never create
    or change anything: where no study database exists (a new path, an empty file, a server database
    without Optuna's tables) they get a :class:`StorageError` saying so. Opening a new database from
    several processes at once is safe: the one that loses the race to create the tables retries.
    ``read_only`` (default: ``not create``): a SQLite database is opened read-only; ``create=False,
    read_only=False`` opens an existing database to write to it (``flashtune worker``).
    """
    read_only = not create if read_only is None else read_only
    url, parsed, backend = _parse(url)
    engine_kwargs = _engine_kwargs(url, parsed, backend, create=create, read_only=read_only)
    callback = stale_trial_callback or requeue_stale
    for attempt in range(1, 7):
        try:
            if not create and backend != "sqlite":
                _require_schema(url, engine_kwargs)
            with warnings.catch_warnings():  # heartbeats are on on purpose: no "experimental feature" line on stderr
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = FlashtuneStorage(
                    url,
                    engine_kwargs=engine_kwargs,
                    skip_table_creation=not create,
                    heartbeat_interval=HEARTBEAT_INTERVAL_S,
                    grace_period=GRACE_PERIOD_S,
                    heartbeat_stale_trial_callback=callback,
                )
            break
        except StorageError:
            raise
        except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:
            if _creation_race(e) and attempt < 6:
                time.sleep(random.uniform(0.05, 0.2) * attempt)
                continue
            raise StorageError(f"cannot open storage {mask_url(url)}: {error_reason(e)}") from None
        except RuntimeError as e:
            raise _schema_version_error(url, e) from None
        except (ImportError, ValueError, OSError) as e:
            raise StorageError(f"cannot open storage {mask_url(url)}: {error_reason(e)}") from None
    if backend == "sqlite" and not read_only:
        _lock_sqlite_at_begin(storage.engine)
    return storage


def _schema_version_error(url: str, e: RuntimeError) -> StorageError:
    """Optuna's schema check in one line with the real URL: which side is older, and what to run."""
    text = str(e)
    if "optuna storage upgrade" in text:
        return StorageError(
            f"{mask_url(url)} holds an older Optuna schema than Optuna {optuna.__version__} reads; back the "
            f"database up, then run `optuna storage upgrade --storage {mask_url(url)}` and rerun"
        )
    if "no longer compatible" in text:
        return StorageError(
            f"{mask_url(url)} was written by a newer Optuna than this one ({optuna.__version__}); upgrade "
            "Optuna (pip install -U optuna) and rerun"
        )
    return StorageError(f"cannot open storage {mask_url(url)}: {error_reason(e)}")


def _lock_sqlite_at_begin(engine: Engine) -> None:
    """Make every SQLite transaction take the write lock when it begins.

    pysqlite only begins a transaction at the first write, after the reads that decided it, so
    two tuners could both read an enqueued trial as WAITING and both run it (PostgreSQL locks
    the row: ``SELECT ... FOR UPDATE``). ``BEGIN IMMEDIATE`` serialises the transactions
    instead; they are short, and waiting ones queue for up to the connection's timeout. Calls
    made inside :func:`reading` only read, and begin without the lock.
    """

    @event.listens_for(engine, "connect")
    def _driver_leaves_transactions_to_sqlalchemy(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None
        # write-ahead log: a commit appends to the log instead of syncing the database file, and
        # readers do not wait for writers. With synchronous=NORMAL a power cut may lose the last
        # commits (never corrupts); a crash of the tuner loses nothing. A trial costs 2 commits (FlashtuneStorage).
        dbapi_connection.execute("PRAGMA journal_mode=WAL")
        dbapi_connection.execute("PRAGMA synchronous=NORMAL")

    @event.listens_for(engine, "begin")
    def _begin_immediate(connection) -> None:
        connection.exec_driver_sql("BEGIN" if _READ_ONLY.get() else "BEGIN IMMEDIATE")

    engine.dispose()  # connections opened while the tables were created predate the listeners


_READ_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("flashtune_storage_read_only", default=False)


@contextlib.contextmanager
def reading() -> Iterator[None]:
    """Storage calls inside only read: on SQLite their transactions begin without the write lock (in
    write-ahead-log mode they neither wait for writers nor make writers wait). Per thread."""
    token = _READ_ONLY.set(True)
    try:
        yield
    finally:
        _READ_ONLY.reset(token)


def _deleted(e: KeyError) -> bool:
    """Optuna's KeyError for a study or trial row that is no longer there."""
    return bool(e.args) and isinstance(e.args[0], str) and "does not exist" in e.args[0]


def retrying(call: Callable[[], T], *, what: str, attempts: int = 6, first_delay_s: float = 1.0, log=None) -> T:
    """Run a storage operation; while the database is unreachable, retry with doubling delays.

    Says so on stderr at each retry; after ``attempts`` tries raises :class:`StorageError` (what
    was stored stays stored: rerunning the same command resumes). A failure that retrying cannot
    cure (a malformed database file, a constraint violation) is a :class:`StorageError` at once,
    with what the database said.
    """
    delay = first_delay_s
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except KeyError as e:
            if not _deleted(e):
                raise
            raise StorageError(
                f"the study is gone from the storage while {what}: someone deleted it (or its trial) while "
                "this process ran; rerun the command to start it again"
            ) from None
        except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:
            reason = error_reason(e)
            if not is_transient(e):
                raise StorageError(
                    f"storage failed while {what} ({reason}); finished trials are stored: "
                    "rerun the same command to resume once the storage is fixed"
                ) from None
            if attempt == attempts:
                raise StorageError(
                    f"storage unreachable while {what} after {attempts} attempts ({reason}); "
                    "finished trials are stored: rerun the same command to resume"
                ) from None
            print(
                f"flashtune: storage unreachable while {what} ({reason}); retry {attempt}/{attempts - 1} "
                f"in {delay:.0f} s",
                file=log or sys.stderr,
                flush=True,
            )
            time.sleep(delay)
            delay = min(2 * delay, 30.0)
    raise AssertionError("unreachable")
