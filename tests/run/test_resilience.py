"""Nothing stored is lost: kill -9 mid-study, a dead worker's RUNNING trial, the database going away,
and concurrent workers on PostgreSQL. The tuning loop is the real one; nvcc and the GPU are stand-ins
(tests/fakes/standin_tuner.py), since coordination is what is under test here."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tuner.study import DUPLICATE_OF, STATUS

REPO = Path(__file__).resolve().parents[2]
FAST_HEARTBEAT = {"FLASHTUNE_HEARTBEAT_INTERVAL_S": "1", "FLASHTUNE_GRACE_PERIOD_S": "3"}


def _start(storage: str, study: str, n_trials: int, log: Path, sleep_s: float = 0.05, env: dict | None = None):
    return subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.standin_tuner", storage, study, str(n_trials), str(log), str(sleep_s)],
        cwd=REPO,
        env={**os.environ, **FAST_HEARTBEAT, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _trials(storage: str, study: str):
    try:
        return optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)
    except KeyError:  # not created yet
        return []


def _evaluated(trials):
    return [
        t
        for t in trials
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        and t.user_attrs.get(STATUS) not in (None, "infeasible")
        and DUPLICATE_OF not in t.user_attrs
    ]


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _measured_counts(log: Path) -> collections.Counter:
    return (
        collections.Counter(line for line in log.read_text().split() if line) if log.exists() else collections.Counter()
    )


def test_kill_9_then_the_same_command_resumes_with_every_finished_trial_kept(tmp_path):
    storage, log = f"sqlite:///{tmp_path}/study.db", tmp_path / "measured.log"
    proc = _start(storage, "killed", 40, log, sleep_s=0.3)
    try:
        # stored, not only measured: the measurement log is written before the trial is stored
        _wait_for(lambda: sum(t.state.is_finished() for t in _trials(storage, "killed")) >= 5, 120, "5 stored trials")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    before = {t.number: (t.state, t.params, t.value) for t in _trials(storage, "killed") if t.state.is_finished()}
    assert len(before) >= 5
    assert any(t.state == TrialState.RUNNING for t in _trials(storage, "killed"))  # what the kill left behind

    proc = _start(storage, "killed", 40, log)
    _out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    after = _trials(storage, "killed")
    for t in after:  # finished trials are kept exactly
        if t.number in before:
            assert (t.state, t.params, t.value) == before[t.number]
    assert not [t for t in after if t.state == TrialState.RUNNING]
    assert len(_evaluated(after)) == 40
    lost = [t for t in after if t.state == TrialState.FAIL and t.user_attrs.get(STATUS) != "orphaned"]
    orphans = [t for t in after if t.state == TrialState.FAIL and t.user_attrs.get(STATUS) == "orphaned"]
    requeued = [t for t in after if "requeued_from" in t.user_attrs]
    # the others were killed while the sampler drew their knobs (an enqueued config is known before)
    drawn = [t for t in lost if len(t.params) == 8 or t.system_attrs.get("fixed_params")]
    assert lost
    assert {t.user_attrs["requeued_from"] for t in requeued} == {t.number for t in drawn}  # each one re-queued
    assert all(r.state.is_finished() and r.params == after[r.user_attrs["requeued_from"]].params for r in requeued)
    assert all(len(t.params) < 8 for t in orphans)  # only trials cut short while asking are failed without a retry


@pytest.mark.postgres
def test_database_briefly_unreachable_the_worker_retries_and_finishes(postgres, tmp_path):
    log, gate = tmp_path / "measured.log", tmp_path / "gate"
    proc = _start(postgres.url, "outage", 30, log, sleep_s=0.1, env={"FLASHTUNE_STANDIN_GATE": str(gate)})
    _wait_for(lambda: len(_measured_counts(log)) >= 3, 120, "3 measured trials")
    gate.touch()  # hold the tuner inside its next measurement, with that trial still to store
    _wait_for(lambda: Path(f"{gate}.waiting").exists(), 60, "the tuner to wait inside a measurement")
    postgres.stop()
    gate.unlink()  # the store that follows meets the outage
    time.sleep(2.5)
    postgres.start()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert "storage unreachable" in err and "retry" in err
    trials = _trials(postgres.url, "outage")
    assert len(_evaluated(trials)) == 30
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert "secret-pw" not in out + err


@pytest.mark.postgres
def test_database_gone_for_good_the_worker_gives_up_cleanly(postgres, tmp_path):
    log = tmp_path / "measured.log"
    proc = _start(postgres.url, "gone", 500, log, sleep_s=0.1)
    _wait_for(lambda: len(_measured_counts(log)) >= 3, 120, "3 measured trials")
    postgres.stop()
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        postgres.start()
    assert proc.returncode != 0
    assert "StorageError" in err or "storage unreachable" in err
    assert "rerun the same command to resume" in err
    assert "secret-pw" not in out + err


@pytest.mark.postgres
@pytest.mark.slow
def test_concurrent_workers_on_postgres_measure_each_trial_once_and_lose_none(postgres, tmp_path):
    log, workers, target = tmp_path / "measured.log", 6, 60
    procs = [_start(postgres.url, "concurrent", target, log, sleep_s=0.05) for _ in range(workers)]
    for p in procs:
        _out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
    trials = _trials(postgres.url, "concurrent")
    measured = _measured_counts(log)
    assert all(n == 1 for n in measured.values()), [k for k, n in measured.items() if n > 1]  # never twice
    evaluated = _evaluated(trials)
    measured_trials = {f"trial-{t.number}" for t in evaluated}
    assert set(measured) == measured_trials  # every measurement is stored, every stored one was measured
    # the budget is shared through the database: a few trials may start in the same instant past it
    assert target <= len(evaluated) <= target + workers
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING, TrialState.FAIL)]
    print(f"{workers} workers, {len(trials)} trials, {len(evaluated)} evaluated, 0 measured twice, 0 lost")


@pytest.mark.postgres
def test_a_killed_worker_s_running_trial_is_recovered_by_a_live_one(postgres, tmp_path):
    log = tmp_path / "measured.log"
    victim = _start(postgres.url, "victim", 30, log, sleep_s=2.0)  # slow: it will hold a RUNNING trial
    _wait_for(
        lambda: (
            any(t.state == TrialState.RUNNING for t in _trials(postgres.url, "victim"))
            and len(_measured_counts(log)) >= 1
        ),
        120,
        "the victim to hold a trial",
    )
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    held = {t.number for t in _trials(postgres.url, "victim") if t.state == TrialState.RUNNING}
    assert held
    survivor = _start(postgres.url, "victim", 30, log, sleep_s=0.05)
    _out, err = survivor.communicate(timeout=300)
    assert survivor.returncode == 0, err[-2000:]
    trials = {t.number: t for t in _trials(postgres.url, "victim")}
    assert any(len(trials[n].params) == 8 for n in held)  # it was measuring one (2 s each)
    for number in held:
        assert trials[number].state == TrialState.FAIL
        requeued = [t for t in trials.values() if t.user_attrs.get("requeued_from") == number]
        if len(trials[number].params) < 8:  # killed while drawing its knobs: failed, the sampler goes on
            assert not requeued
            continue
        assert len(requeued) == 1 and requeued[0].state.is_finished()
        assert requeued[0].params == trials[number].params
        assert "lost its worker" in requeued[0].user_attrs["requeue_reason"]
