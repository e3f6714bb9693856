"""One storage contract, run on every backend flashtune supports (as Optuna's ``STORAGE_MODES`` run its
storage tests): study metadata, create-or-load from racing processes, read-only opening, heartbeat
recovery, and a tuning loop, on SQLite and on PostgreSQL (a throwaway server, tests/pg_server.py;
those runs carry the ``postgres`` marker and skip with the reason where no server can start)."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.conftest import fast_dir
from tests.fakes.fake_compile import fake_compiler
from tests.fakes.fake_measure import FakeMeasure
from tests.pg_server import PostgresServer
from tuner.devices import DeviceLimits, limits_for_arch
from tuner.problem import Problem
from tuner.run import TuneSettings, tune
from tuner.search import make_sampler, make_search
from tuner.space import load_space
from tuner.study import StorageError, open_storage
from tuner.study import _heartbeat as hb
from tuner.study import _meta as st

REPO = Path(__file__).resolve().parents[2]
STORAGE_MODES = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
GPU = {
    "name": "Fake GPU",
    "arch": 80,
    "num_sms": 108,
    "smem_per_block_optin": 166912,
    "regs_per_sm": 65536,
    "driver": "0.0",
}
PROBLEM = Problem(batch=2, seqlen_q=512, heads_q=4, head_dim=128)


def _new_pg_database(server: PostgresServer) -> tuple[str, str]:
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(
        host="127.0.0.1", port=server.port, user="flashtune", dbname="postgres", autocommit=True
    ) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name, server.url.rsplit("/", 1)[0] + f"/{name}"


def _drop_pg_database(server: PostgresServer, name: str) -> None:
    import psycopg

    with psycopg.connect(
        host="127.0.0.1", port=server.port, user="flashtune", dbname="postgres", autocommit=True
    ) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=STORAGE_MODES)
def url(request):
    """URL of a new, empty database of each backend (nothing created in it yet)."""
    if request.param == "sqlite":
        with fast_dir() as directory:
            yield f"sqlite:///{directory}/studies.db"
        return
    pytest.importorskip("psycopg")
    server = request.getfixturevalue("postgres")
    name, database_url = _new_pg_database(server)
    yield database_url
    _drop_pg_database(server, name)


def _tables(url: str) -> set[str]:
    from sqlalchemy import create_engine, inspect

    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _open(storage, space, *, name="s", gpu=GPU, problem=PROBLEM) -> optuna.Study:
    return st.open_study(
        storage=storage, name=name, space=space, problem=problem, gpu=gpu, sampler=make_sampler("random", space, 0)
    )


# -- study metadata ------------------------------------------------------------------------------------------
def test_a_new_study_carries_its_metadata_read_back_as_one_typed_record(url, toy_space):
    study = _open(open_storage(url), toy_space)
    meta = st.StudyMeta.read(optuna.load_study(study_name="s", storage=open_storage(url)))
    assert (meta.name, meta.family, meta.problem, meta.gpu_name) == ("s", "toy", PROBLEM, "Fake GPU")
    assert meta.schema == st.SCHEMA_VERSION and meta.space_digest == st.space_digest(toy_space)
    assert meta.device() == DeviceLimits.from_info(GPU)
    [default] = study.get_trials()
    assert default.state == TrialState.WAITING and default.user_attrs == {st.IS_DEFAULT: True}


def test_resuming_checks_the_stored_metadata(url, toy_space, tmp_path):
    storage = open_storage(url)
    _open(storage, toy_space)
    assert len(_open(storage, toy_space).get_trials()) == 1  # resumed, the default not enqueued twice
    with pytest.raises(st.StudyError, match="measured on"):
        _open(storage, toy_space, gpu={**GPU, "name": "Other GPU"})
    with pytest.raises(st.StudyError, match="tunes problem"):
        _open(storage, toy_space, problem=Problem(batch=3, seqlen_q=512, heads_q=4, head_dim=128))
    optuna.create_study(study_name="plain", storage=storage)
    with pytest.raises(st.NotFlashtuneError, match="not created by flashtune"):
        _open(storage, toy_space, name="plain")


def test_metadata_of_a_study_written_by_hand_is_refused_not_trusted(url, toy_space):
    storage = open_storage(url)
    study = _open(storage, toy_space)
    for key, value in (("problem", {"batch": "1; DROP TABLE"}), ("family", "../../x"), ("flashtune", {"schema": "1"})):
        study.set_user_attr(key, value)
        with pytest.raises(st.StudyError):
            st.StudyMeta.read(optuna.load_study(study_name="s", storage=storage))


def _create_or_load(url: str, space_path: str, start, out) -> None:
    try:
        start.wait()
        space = load_space(space_path)
        study = _open(open_storage(url), space)
        out.put(("ok", study.study_name))
    except Exception as e:
        out.put(("error", f"{type(e).__name__}: {e}"))


def test_racing_tuners_create_storage_and_study_once(url, toy_path):
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_create_or_load, args=(url, str(toy_path), start, out)) for _ in range(6)]
    for p in procs:
        p.start()
    start.set()
    results = [out.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert results == [("ok", "s")] * 6, results
    storage = open_storage(url)
    assert [s.study_name for s in optuna.get_all_study_summaries(storage)] == ["s"]
    study = optuna.load_study(study_name="s", storage=storage)
    assert len(study.get_trials()) == 1 and st.StudyMeta.read(study).family == "toy"  # one default, complete attrs


def test_reading_commands_create_nothing_in_an_empty_database(url):
    if url.startswith("sqlite"):
        Path(url.removeprefix("sqlite:///")).touch()
    with pytest.raises(StorageError, match="no study database"):
        open_storage(url, create=False)
    if url.startswith("sqlite"):
        assert Path(url.removeprefix("sqlite:///")).stat().st_size == 0
    else:
        assert _tables(url) == set()
    open_storage(url)  # a command that writes creates the schema
    assert {"studies", "trials", "version_info"} <= _tables(url)
    assert open_storage(url, create=False) is not None


# -- heartbeat recovery -------------------------------------------------------------------------------------
def _age_beats(storage, trial_ids: list[int]) -> None:
    """Make these trials' last beats older than the grace period (by the database's clock), as if their tuners
    had stopped beating a little while ago."""
    import sqlalchemy
    from optuna.storages._rdb import models

    session = storage.scoped_session()
    try:
        now = session.execute(sqlalchemy.func.now()).scalar().replace(tzinfo=None)
        session.query(models.TrialHeartbeatModel).filter(models.TrialHeartbeatModel.trial_id.in_(trial_ids)).update(
            {models.TrialHeartbeatModel.heartbeat: now - timedelta(seconds=hb.GRACE_PERIOD_S + 30)},
            synchronize_session=False,
        )
        session.commit()
    finally:
        session.close()


def _held_trial(study, storage, space, owner: dict | None):
    """A RUNNING trial with every knob drawn, owned by ``owner``, that has beaten once."""
    trial = study.ask()
    for knob in space.knobs:
        trial.suggest_categorical(knob.name, list(knob.values))
    if owner is not None:
        storage.set_trial_system_attr(trial._trial_id, hb.OWNER, owner)
    storage.record_heartbeat(trial._trial_id)
    return trial


def test_heartbeat_recovery_fails_only_trials_whose_tuner_is_gone(url, monkeypatch):
    space = load_space("sm80")
    storage = open_storage(url)
    study = _open(storage, space)
    gone = _held_trial(study, storage, space, {**hb.this_process(), "started": "-1"})  # this pid, another process
    elsewhere = _held_trial(study, storage, space, {"host": "another-host", "boot_id": "x", "pid": 1, "started": "1"})
    unowned = _held_trial(study, storage, space, None)
    alive = _held_trial(study, storage, space, hb.this_process())  # this very process: alive, merely late
    fresh = _held_trial(study, storage, space, {**hb.this_process(), "started": "-1"})  # beating on time
    _age_beats(storage, [t._trial_id for t in (gone, elsewhere, unowned, alive)])

    assert hb.recover_stale(study, frozenset(k.name for k in space.knobs)) == 3
    states = {t.number: t for t in study.get_trials()}
    for t in (gone, elsewhere, unowned):
        assert states[t.number].state == TrialState.FAIL
        [again] = [w for w in states.values() if w.user_attrs.get(hb.REQUEUED_FROM) == t.number]
        assert again.state == TrialState.WAITING and "lost its worker" in again.user_attrs[hb.REQUEUE_REASON]
    assert states[alive.number].state == TrialState.RUNNING
    assert states[fresh.number].state == TrialState.RUNNING
    assert hb.recover_stale(study, frozenset(k.name for k in space.knobs)) == 0  # nothing twice

    # a live owner that stopped beating for good is recovered in the end
    monkeypatch.setattr(hb, "LIVE_OWNER_GRACE_S", 0)
    assert hb.recover_stale(study, frozenset(k.name for k in space.knobs)) == 1
    assert study._storage.get_trial(alive._trial_id).state == TrialState.FAIL


def test_a_trial_that_never_beat_is_orphaned_only_when_old_and_its_owner_gone(url, monkeypatch):
    space = load_space("sm80")
    storage = open_storage(url)
    study = _open(storage, space)
    study.ask()  # the enqueued default: asked, never drawn, never beat (its tuner died right after asking)
    knobs = frozenset(k.name for k in space.knobs)
    assert hb.recover_stale(study, knobs) == 0  # too young: its tuner may still be on its way to the first beat
    monkeypatch.setattr(hb, "ORPHAN_AFTER_S", -1)
    assert hb.recover_stale(study, knobs) == 1
    [orphan] = [t for t in study.get_trials() if t.state == TrialState.FAIL]
    assert orphan.user_attrs[st.STATUS] == st.TrialStatus.ORPHANED


def test_recovery_takes_the_stale_trial_callback_its_storage_was_opened_with(url):
    space = load_space("sm80")
    seen = []
    storage = open_storage(url, stale_trial_callback=lambda study, trial: seen.append(trial.number))
    study = _open(storage, space)
    trial = _held_trial(study, storage, space, {**hb.this_process(), "started": "-1"})
    _age_beats(storage, [trial._trial_id])
    assert hb.recover_stale(study, frozenset(k.name for k in space.knobs)) == 1
    assert seen == [trial.number]
    assert not [t for t in study.get_trials() if t.state == TrialState.WAITING]  # the default policy did not run


# -- the tuning loop ------------------------------------------------------------------------------------------
def test_a_tuning_loop_stores_every_trial(url, toy_space):
    storage = open_storage(url)
    study = _open(storage, toy_space)
    summary = tune(
        study,
        toy_space,
        PROBLEM,
        limits_for_arch(80),
        FakeMeasure(),
        TuneSettings(n_trials=6, compile_workers=1, compile_ahead=2),
        compiler=fake_compiler,
        search=make_search("random", toy_space, PROBLEM, limits_for_arch(80), 0),
    )
    again = optuna.load_study(study_name="s", storage=open_storage(url))
    trials = again.get_trials()
    assert summary.evaluated == 6 == sum(st.is_evaluated(t) for t in trials)
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert all(st.TrialStatus.of(t) is not None for t in trials)
    best = st.winner(again)
    assert best["tflops"] == max(t.value for t in trials if t.state == TrialState.COMPLETE)


@pytest.mark.slow
def test_concurrent_tuners_with_short_heartbeats_all_finish_and_measure_each_trial_once(url, tmp_path):
    """Issue 11, item 7: tuners on one study with a 1 s beat and a 3 s grace period; a slow beat (a busy
    database) must not make a live tuner's trial look stale, and no tuner may crash."""
    log, tuners, target = tmp_path / "measured.log", 6, 48  # at commit 6a12dc0: 3 of 6 crashed, trials lost
    env = {**os.environ, "FLASHTUNE_HEARTBEAT_INTERVAL_S": "1", "FLASHTUNE_GRACE_PERIOD_S": "3"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.fakes.standin_tuner", url, "race", str(target), str(log), "0.05"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(tuners)
    ]
    for p in procs:
        _out, err = p.communicate(timeout=600)
        assert p.returncode == 0 and "UpdateFinishedTrialError" not in err, err[-3000:]
    measured = [line for line in log.read_text().split() if line]
    assert len(measured) == len(set(measured)), "a trial was measured twice"
    trials = optuna.load_study(study_name="race", storage=open_storage(url)).get_trials()
    assert not [t for t in trials if t.state == TrialState.FAIL], [
        (t.number, t.user_attrs) for t in trials if t.state == TrialState.FAIL
    ]
    assert target <= sum(st.is_evaluated(t) for t in trials) <= target + tuners
