"""replay in processes: never more of them than runs, and none left once it returns, fails or is stopped."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest

from tuner.devices import limits_for_arch
from tuner.problem import Problem
from tuner.run import ReplayError, planted, replay
from tuner.run._replay import Oracle
from tuner.space import config_key, load_space

SM90_SMALL = Path(__file__).resolve().parents[1] / "data" / "sm90_small.toml"
PROBLEM = Problem(batch=4, seqlen_q=512, heads_q=16, head_dim=128, causal=False)


def _oracle():
    return planted(load_space(SM90_SMALL), PROBLEM, limits_for_arch(90), 5)


def test_jobs_beyond_the_runs_start_one_process_per_run_and_leave_none(monkeypatch):
    started: list[int] = []
    real = mp.get_context("spawn").Pool

    class CountingContext:
        def Pool(self, processes, **kw):
            started.append(processes)
            return real(processes, **kw)

    import tuner.run._replay as replay_module

    monkeypatch.setattr(replay_module.mp, "get_context", lambda _name: CountingContext())
    runs = replay(_oracle(), ["random"], range(2), 5, jobs=10_000)
    assert len(runs) == 2 and started == [2]
    assert not mp.active_children()


def test_a_failing_run_leaves_no_process():
    space = load_space(SM90_SMALL)
    # a stored study that measured the default only: the second proposal was never measured
    oracle = Oracle(
        study_name="partial",
        space=space,
        problem=PROBLEM,
        device=limits_for_arch(90),
        results={config_key(space.defaults(PROBLEM.head_dim)): 100.0},
    )
    with pytest.raises(ReplayError, match="never measured"):
        replay(oracle, ["random"], range(3), 5, jobs=3)
    assert not mp.active_children()
