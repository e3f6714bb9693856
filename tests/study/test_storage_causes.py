"""tuner.study storage failures named by their cause: a database another process holds locked, a hot
journal left by a writer that died, an old schema; none of them changes a byte."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

import tuner.study._storage as storage_module
from tests.fake_studies import make_study
from tuner.cli import main
from tuner.study import StorageError, open_storage


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("source")
    make_study(f"sqlite:///{folder}/s.db", "good", n_trials=6, failures=False)
    return folder / "s.db"


@pytest.fixture
def rollback_db(source, tmp_path) -> Path:
    """A copy of the study database in rollback-journal mode (as a backup or the sqlite3 shell leaves one)."""
    db = tmp_path / "r.db"
    src, dst = sqlite3.connect(f"file:{source}?mode=ro", uri=True), sqlite3.connect(db)
    src.backup(dst)
    src.close()
    dst.execute("PRAGMA journal_mode=DELETE")
    dst.close()
    return db


def _one_error_line(capsys, *argv: str) -> str:
    rc = main(list(argv))
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc != 0 and len(err) == 1 and "internal error" not in err[0], err
    return err[0]


@pytest.mark.parametrize("create", [False, True])
def test_a_database_held_locked_is_reported_as_locked(rollback_db, monkeypatch, create):
    monkeypatch.setattr(storage_module, "LOCK_WAIT_S", 0.3)
    holder = sqlite3.connect(rollback_db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StorageError, match="locked by another process") as info:
            open_storage(f"sqlite:///{rollback_db}", create=create)
        assert "not a SQLite database" not in str(info.value)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    open_storage(f"sqlite:///{rollback_db}", create=False)  # once let go, it opens


def test_a_locked_database_waits_for_its_holder(rollback_db, monkeypatch):
    """A lock held shorter than the wait is waited out, as the tuner waits for its write lock."""
    monkeypatch.setattr(storage_module, "LOCK_WAIT_S", 20.0)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            f"c = sqlite3.connect({str(rollback_db)!r}, isolation_level=None)\n"
            "c.execute('BEGIN EXCLUSIVE'); print('held', flush=True); time.sleep(1.5); c.execute('ROLLBACK')\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        storage = open_storage(f"sqlite:///{rollback_db}", create=False)
        assert [s.study_name for s in storage.get_all_studies()] == ["good"]
    finally:
        holder.wait(30)


def _leave_hot_journal(db: Path) -> None:
    """A writer that dies mid-transaction after SQLite spilled pages into the database file."""
    code = (
        "import os, sqlite3\n"
        f"c = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
        "c.execute('PRAGMA cache_size=1'); c.execute('BEGIN')\n"
        "c.execute('CREATE TABLE filler (x)')\n"
        "for i in range(3000): c.execute('INSERT INTO filler VALUES (?)', ('x' * 500,))\n"
        "c.execute(\"UPDATE trial_user_attributes SET value_json = '0'\")\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert Path(f"{db}-journal").stat().st_size > 0


def test_a_hot_journal_is_named_and_left_alone_by_reading_commands(rollback_db, capsys):
    _leave_hot_journal(rollback_db)
    before = _digests(rollback_db.parent)
    for argv in (["studies"], ["best", "--study", "good"], ["export", "--study", "good"]):
        line = _one_error_line(capsys, *argv, "--storage", f"sqlite:///{rollback_db}")
        assert "hot journal" in line and "intact" in line and "not a SQLite database" not in line, line
    assert _digests(rollback_db.parent) == before
    # a writer rolls the journal back: the database is as it was before the dead transaction
    storage = open_storage(f"sqlite:///{rollback_db}")
    study = optuna.load_study(study_name="good", storage=storage)
    assert all(t.user_attrs != {} for t in study.get_trials())
    assert not Path(f"{rollback_db}-journal").exists() or Path(f"{rollback_db}-journal").stat().st_size == 0


@pytest.mark.parametrize("create", [False, True])
def test_an_old_schema_says_how_to_upgrade_with_the_real_url(rollback_db, capsys, create):
    conn = sqlite3.connect(rollback_db)
    conn.execute("UPDATE alembic_version SET version_num = 'v3.0.0.a'")
    conn.commit()
    conn.close()
    url = f"sqlite:///{rollback_db}"
    before = _digests(rollback_db.parent)
    with pytest.raises(StorageError) as info:
        open_storage(url, create=create)
    message = str(info.value)
    assert "older Optuna schema" in message and f"optuna storage upgrade --storage {url}" in message
    assert "$STORAGE_URL" not in message and "\n" not in message
    if not create:
        assert _digests(rollback_db.parent) == before


def test_a_schema_from_a_newer_optuna_says_to_upgrade_optuna(rollback_db):
    conn = sqlite3.connect(rollback_db)
    conn.execute("UPDATE alembic_version SET version_num = 'v99.0.0.a'")
    conn.commit()
    conn.close()
    with pytest.raises(StorageError, match="newer Optuna"):
        open_storage(f"sqlite:///{rollback_db}", create=False)


def test_a_reading_open_cannot_write_and_a_joining_one_can(rollback_db):
    url = f"sqlite:///{rollback_db}"
    before = _digests(rollback_db.parent)
    study = optuna.load_study(study_name="good", storage=open_storage(url, create=False))
    with pytest.raises(optuna.exceptions.StorageInternalError) as info:
        study.set_user_attr("probe", 1)
    assert "readonly" in str(info.value.__cause__)
    assert _digests(rollback_db.parent) == before
    joined = optuna.load_study(study_name="good", storage=open_storage(url, create=False, read_only=False))
    joined.set_user_attr("probe", 1)
    assert optuna.load_study(study_name="good", storage=open_storage(url, create=False)).user_attrs["probe"] == 1
