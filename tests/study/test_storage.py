"""tuner.study's storage: URLs, the default SQLite file, refusing other programs' files, masked passwords, retries."""

from __future__ import annotations

import io
import sqlite3
import time

import optuna
import pytest

from tuner.study import DEFAULT_STORAGE, FlashtuneStorage, StorageError, mask_url, open_storage, retrying


def test_default_storage_creates_its_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert DEFAULT_STORAGE == "sqlite:///studies/flashtune.db"
    storage = open_storage(None)
    assert isinstance(storage, FlashtuneStorage) and isinstance(storage, optuna.storages.RDBStorage)
    assert (tmp_path / "studies").is_dir()
    optuna.create_study(study_name="x", storage=storage)
    assert (tmp_path / "studies" / "flashtune.db").stat().st_size > 0


def test_nested_sqlite_folder_is_created(tmp_path):
    open_storage(f"sqlite:///{tmp_path}/a/b/c/studies.db")
    assert (tmp_path / "a" / "b" / "c").is_dir()


def test_existing_optuna_database_opens(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    optuna.create_study(study_name="kept", storage=open_storage(url))
    names = [s.study_name for s in optuna.get_all_study_summaries(open_storage(url))]
    assert names == ["kept"]


@pytest.mark.parametrize("url", ["not a url", "://nothing", "sqlite//missing-colon.db", "http//host"])
def test_invalid_url(url):
    with pytest.raises(StorageError, match="invalid storage URL"):
        open_storage(url)


def test_unknown_dialect(tmp_path):
    with pytest.raises(StorageError, match="cannot open storage"):
        open_storage("nosuchdb://user@host/db")


def test_sqlite_file_of_another_program_is_refused_and_unchanged(tmp_path):
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO users (name) VALUES ('ada')")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(StorageError, match="another program's tables \\(users\\)") as info:
        open_storage(f"sqlite:///{path}")
    assert str(path) in str(info.value)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]  # no journal or WAL left behind


def test_non_sqlite_file_is_refused_and_unchanged(tmp_path):
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 50)
    before = path.read_bytes()
    with pytest.raises(StorageError, match="not a SQLite database"):
        open_storage(f"sqlite:///{path}")
    assert path.read_bytes() == before


def test_empty_file_becomes_a_study_database(tmp_path):
    path = tmp_path / "empty.db"
    path.touch()
    optuna.create_study(study_name="x", storage=open_storage(f"sqlite:///{path}"))
    assert path.stat().st_size > 0


def test_unreachable_postgres_fails_quickly_with_the_password_masked():
    pytest.importorskip("psycopg")
    url = "postgresql+psycopg://tuner:s3cret-pw@127.0.0.1:1/flashtune"
    start = time.monotonic()
    with pytest.raises(StorageError) as info:
        open_storage(url)
    assert time.monotonic() - start < 20
    message = str(info.value)
    assert "s3cret-pw" not in message
    assert "***" in message and "127.0.0.1" in message
    assert "\n" not in message


def test_postgres_without_driver_is_a_storage_error(monkeypatch):
    """The psycopg extra not installed: a clear error, not an ImportError traceback."""
    import builtins

    real_import = builtins.__import__

    def no_psycopg(name, *args, **kwargs):
        if name == "psycopg" or name.startswith("psycopg."):
            raise ModuleNotFoundError("No module named 'psycopg'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_psycopg)
    with pytest.raises(StorageError, match="cannot open storage") as info:
        open_storage("postgresql+psycopg://u:hunter2@127.0.0.1:1/db")
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        (
            "postgresql+psycopg://user:secret@db.example.com:5432/studies",
            "postgresql+psycopg://user:***@db.example.com:5432/studies",
        ),
        ("postgresql://user:p%40ss@host/db", "postgresql://user:***@host/db"),
        ("mysql+pymysql://root:pw@localhost/optuna", "mysql+pymysql://root:***@localhost/optuna"),
        ("postgresql://user@host/db", "postgresql://user@host/db"),
        ("sqlite:///studies/flashtune.db", "sqlite:///studies/flashtune.db"),
        ("no url at all", "<unparsable storage URL>"),
        (
            "postgresql+psycopg://u@h/db?password=secret&sslmode=require",
            "postgresql+psycopg://u@h/db?password=***&sslmode=require",
        ),
        ("postgresql://u@h/db?sslpassword=k&PASSFILE=/p", "postgresql://u@h/db?PASSFILE=***&sslpassword=***"),
    ],
)
def test_mask_url(url, masked):
    assert mask_url(url) == masked


def test_retrying_retries_then_succeeds(capsys):
    from sqlalchemy.exc import OperationalError

    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise OperationalError("SELECT 1", {}, Exception("server closed the connection"))
        return "done"

    assert retrying(flaky, what="testing", attempts=4, first_delay_s=0.01) == "done"
    assert len(calls) == 3
    assert capsys.readouterr().err.count("retry") == 2


def test_retrying_gives_up_with_a_storage_error():
    from sqlalchemy.exc import OperationalError

    def down():
        raise OperationalError("SELECT 1", {}, Exception("connection refused"))

    with pytest.raises(StorageError, match="after 2 attempts"):
        retrying(down, what="testing", attempts=2, first_delay_s=0.01, log=io.StringIO())


def test_retrying_does_not_swallow_other_errors():
    def broken():
        raise KeyError("not a storage problem")

    with pytest.raises(KeyError):
        retrying(broken, what="testing", attempts=3, first_delay_s=0.01)


def test_reading_commands_do_not_create_a_database(tmp_path):
    missing = tmp_path / "nowhere" / "studies.db"
    with pytest.raises(StorageError, match="no study database"):
        open_storage(f"sqlite:///{missing}", create=False)
    assert not missing.parent.exists()


def _pop_waiting(url: str, start, out) -> None:
    study = optuna.load_study(study_name="race", storage=open_storage(url))
    start.wait()
    out.put([study.ask().number for _ in range(6)])


def test_concurrent_tuners_on_sqlite_never_pop_the_same_enqueued_trial(tmp_path):
    # pysqlite opens a transaction only at the first write, after the read that found the trial
    # WAITING: without the write lock taken at BEGIN, two tuners both ran trial 0 (CI, session 1)
    import multiprocessing as mp

    url = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="race", storage=open_storage(url))
    for i in range(48):
        study.enqueue_trial({"x": i})
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_pop_waiting, args=(url, start, out)) for _ in range(8)]
    for p in procs:
        p.start()
    time.sleep(3)  # every process has opened the storage
    start.set()
    popped = [n for _ in procs for n in out.get(timeout=120)]
    for p in procs:
        p.join(timeout=60)
    assert sorted(popped) == list(range(48))  # each enqueued trial went to exactly one tuner


def test_a_schema_another_tuner_is_still_creating_is_not_taken_for_another_program_s(tmp_path):
    """Two tuners opening a new database at once: one may look while the other has created some of Optuna's
    tables only. Those are Optuna's (names and columns), so the file is not refused; a same-named table of
    other columns is."""
    import sqlite3

    from tuner.study import open_storage

    path = tmp_path / "s.db"
    open_storage(f"sqlite:///{path}").engine.dispose()
    with sqlite3.connect(path) as conn:
        kept = {"studies", "version_info", "study_directions"}
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall():
            if name not in kept:
                conn.execute(f'DROP TABLE "{name}"')
    open_storage(f"sqlite:///{path}")  # completes the schema instead of refusing the file
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE studies (name TEXT)")
    with pytest.raises(StorageError, match="another program"):
        open_storage(f"sqlite:///{other}")
