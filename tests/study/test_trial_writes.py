"""tuner.study's trial writes: the loop's own trial writes store exactly what Optuna's calls store, on SQLite,
on PostgreSQL and (through Optuna's calls) in memory and on a plain Optuna RDB storage, each in one short
transaction on flashtune's storage; the accessors of what Optuna keeps private; reading: reads that take no
write lock."""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from datetime import datetime, timedelta

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from tests.conftest import fast_dir
from tests.study.test_storage_contract import _drop_pg_database, _new_pg_database
from tuner.study import (
    KNOB_ENCODING,
    OWNER,
    FlashtuneStorage,
    TrialRef,
    create_running_trial,
    finish_trial,
    knob_distributions,
    open_storage,
    pop_waiting_trial_id,
    reading,
    study_storage,
    this_process,
    trial_id_of,
)
from tuner.study._optuna_storage import flashtune_storage

MODES = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres), "memory", "plain-rdb"]


def distributions(space):
    """The knobs' distributions as a study made by this version stores them (ordered knobs as integers)."""
    return knob_distributions(space, {KNOB_ENCODING: "steps"})


@pytest.fixture(params=MODES)
def storage(request):
    if request.param == "memory":
        yield optuna.storages.InMemoryStorage()
        return
    if request.param == "plain-rdb":  # not flashtune's storage: Optuna's public calls
        with fast_dir() as directory:
            yield optuna.storages.RDBStorage(f"sqlite:///{directory}/studies.db")
        return
    if request.param == "sqlite":
        with fast_dir() as directory:
            yield open_storage(f"sqlite:///{directory}/studies.db")
        return
    pytest.importorskip("psycopg")
    server = request.getfixturevalue("postgres")
    name, url = _new_pg_database(server)
    yield open_storage(url)
    _drop_pg_database(server, name)


def _study(storage) -> optuna.Study:
    return optuna.create_study(storage=storage, study_name="s", direction="maximize")


def _reread(study: optuna.Study, trial: TrialRef) -> FrozenTrial:
    """The trial as a new process reads it (past any cache of this one)."""
    storage = study._storage
    backend = getattr(storage, "_backend", storage)
    if isinstance(backend, optuna.storages.InMemoryStorage):
        return backend.get_trial(trial.trial_id)
    fresh = optuna.load_study(study_name=study.study_name, storage=optuna.storages.RDBStorage(backend.url))
    [stored] = [t for t in fresh.get_trials(deepcopy=False) if t._trial_id == trial.trial_id]
    return stored


def test_a_created_trial_holds_what_optuna_s_own_creation_holds(storage, toy_space):
    dists = distributions(toy_space)
    config = toy_space.defaults()
    study = _study(storage)
    theirs = study.ask(dists)  # Optuna's own: number 0
    ours = create_running_trial(
        study, config, dists, user_attrs={"exploration": True, "note": [1, "a"]}, system_attrs={OWNER: this_process()}
    )
    again = study.ask()  # numbering goes on densely across both ways of creating trials
    assert (theirs.number, ours.number, again.number) == (0, 1, 2)
    stored = _reread(study, ours)
    assert stored.state == TrialState.RUNNING and stored.number == 1
    assert stored.params == config and stored.distributions == dists
    assert stored.user_attrs == {"exploration": True, "note": [1, "a"]}
    assert stored.system_attrs[OWNER] == this_process()
    assert abs(stored.datetime_start - datetime.now()) < timedelta(minutes=1)  # local time, as Optuna shows it
    optuna_made = _reread(study, TrialRef.of(theirs))
    assert set(optuna_made.distributions) == set(stored.distributions)


def test_a_created_trial_has_its_first_heartbeat_where_the_storage_keeps_them(toy_space):
    with fast_dir() as directory:
        storage = open_storage(f"sqlite:///{directory}/s.db")
        study = _study(storage)
        trial = create_running_trial(study, toy_space.defaults(), distributions(toy_space))
        assert storage.get_heartbeat_interval()
        assert trial.trial_id not in storage._get_stale_trial_ids(study._study_id)  # it beat just now
        from optuna.storages._rdb import models

        session = storage.scoped_session()
        try:
            assert session.query(models.TrialHeartbeatModel).filter_by(trial_id=trial.trial_id).count() == 1
        finally:
            session.close()


@pytest.mark.parametrize("value", [251.5, math.inf])
def test_finishing_stores_state_value_and_attributes_all_at_once(storage, toy_space, value):
    dists = distributions(toy_space)
    study = _study(storage)
    trial = create_running_trial(study, toy_space.defaults(), dists, user_attrs={"exploration": True, "status": "?"})
    assert finish_trial(
        study,
        trial,
        state=TrialState.COMPLETE,
        value=value,
        user_attrs={"status": "ok", "measurement": {"tflops": value, "reps": 10}},
    )
    stored = _reread(study, trial)
    assert stored.state == TrialState.COMPLETE and stored.value == value and stored.datetime_complete is not None
    assert stored.user_attrs == {"exploration": True, "status": "ok", "measurement": {"tflops": value, "reps": 10}}
    assert study.best_trial.number == trial.number  # Optuna's own queries see the value

    # a trial no longer RUNNING (stored already, or failed as stale by another tuner) is left as it is
    assert not finish_trial(study, trial, state=TrialState.PRUNED, user_attrs={"status": "late"})
    assert _reread(study, trial).user_attrs["status"] == "ok"


def test_pruned_and_failed_trials_carry_no_value(storage, toy_space):
    dists = distributions(toy_space)
    study = _study(storage)
    for state in (TrialState.PRUNED, TrialState.FAIL):
        trial = create_running_trial(study, toy_space.defaults(), dists)
        assert finish_trial(study, trial, state=state, user_attrs={"status": "wrong_result"})
        stored = _reread(study, trial)
        assert (stored.state, stored.value, stored.user_attrs["status"]) == (state, None, "wrong_result")
    with pytest.raises(ValueError, match="needs its value"):
        finish_trial(study, create_running_trial(study, toy_space.defaults(), dists), state=TrialState.COMPLETE)


def test_reads_inside_reading_do_not_wait_for_a_writer():
    with fast_dir() as directory:
        url = f"sqlite:///{directory}/s.db"
        study = _study(open_storage(url))
        study.ask()
        reader = optuna.load_study(study_name="s", storage=open_storage(url))
        writer = sqlite3.connect(f"{directory}/s.db", isolation_level=None)
        writer.execute("BEGIN IMMEDIATE")  # another tuner holds the write lock ...
        try:
            done = threading.Event()

            def read() -> None:
                with reading():
                    reader.get_trials(deepcopy=False)
                done.set()

            t0 = time.monotonic()
            threading.Thread(target=read, daemon=True).start()
            assert done.wait(10), "a read waited for the writer"  # ... and a read goes on regardless
            assert time.monotonic() - t0 < 10
        finally:
            writer.execute("ROLLBACK")
            writer.close()


def _statements(storage: FlashtuneStorage) -> list[str]:
    """The SQL statements ``storage`` sends from now on (appended as they go)."""
    from sqlalchemy import event

    sent: list[str] = []
    event.listen(storage.engine, "before_cursor_execute", lambda *args: sent.append(args[2]))
    return sent


def test_on_flashtune_s_storage_a_trial_is_created_and_finished_in_a_few_statements(toy_space):
    """Optuna's calls took ~40 statements to create a trial of 13 knobs: here each write is one transaction
    of a handful, however many knobs."""
    with fast_dir() as directory:
        storage = open_storage(f"sqlite:///{directory}/s.db")
        study = _study(storage)
        dists = distributions(toy_space)
        sent = _statements(storage)
        trial = create_running_trial(
            study, toy_space.defaults(), dists, user_attrs={"exploration": True}, system_attrs={OWNER: this_process()}
        )
        assert len(dists) >= 4 and len(sent) <= 9, sent
        sent.clear()
        assert finish_trial(study, trial, state=TrialState.COMPLETE, value=1.0, user_attrs={"status": "ok"})
        assert len(sent) <= 7, sent
        assert _reread(study, trial).value == 1.0


def test_the_study_s_storage_is_found_behind_optuna_s_caching_wrapper_and_only_flashtune_s_is_taken(tmp_path):
    ours = open_storage(f"sqlite:///{tmp_path}/ours.db")
    study = _study(ours)
    assert study_storage(study) is not ours  # Optuna wraps an RDB storage in its cache ...
    assert flashtune_storage(study_storage(study)) is ours and flashtune_storage(ours) is ours  # ... unwrapped
    assert flashtune_storage(optuna.storages.InMemoryStorage()) is None
    plain = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/plain.db")
    assert flashtune_storage(plain) is None and flashtune_storage(study_storage(_study(plain))) is None


def test_a_trial_s_id_and_the_next_waiting_trial_come_from_the_study(storage, toy_space):
    study = _study(storage)
    asked = study.ask()
    assert trial_id_of(asked) == trial_id_of(study_storage(study).get_trial(trial_id_of(asked)))
    assert pop_waiting_trial_id(study) is None  # nothing enqueued
    study.enqueue_trial(toy_space.defaults())
    waiting = pop_waiting_trial_id(study)
    assert waiting is not None and study_storage(study).get_trial(waiting).state == TrialState.RUNNING
    assert pop_waiting_trial_id(study) is None  # taken once
