"""tuner.heartbeat: the timing knobs read from the environment (recovery itself: test_resilience.py, test_run.py)."""

from __future__ import annotations

import pytest

from tuner.study._heartbeat import _seconds_from_env


@pytest.mark.parametrize(("text", "expected"), [(None, 60), ("30", 30), ("30.5", 31), ("2.0", 2)])
def test_seconds_from_the_environment_are_whole_and_positive(monkeypatch, text, expected):
    if text is None:
        monkeypatch.delenv("FLASHTUNE_GRACE_PERIOD_S", raising=False)
    else:
        monkeypatch.setenv("FLASHTUNE_GRACE_PERIOD_S", text)
    assert _seconds_from_env("FLASHTUNE_GRACE_PERIOD_S", 60) == expected


@pytest.mark.parametrize("text", ["soon", "0", "-3", ""])
def test_an_unusable_value_warns_and_keeps_the_default(monkeypatch, capsys, text):
    monkeypatch.setenv("FLASHTUNE_GRACE_PERIOD_S", text)
    assert _seconds_from_env("FLASHTUNE_GRACE_PERIOD_S", 60) == 60
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("flashtune: warning: FLASHTUNE_GRACE_PERIOD_S=")
    assert lines[0].endswith("; using 60") and ".py" not in lines[0]


def test_an_enqueued_config_whose_worker_died_while_drawing_it_is_enqueued_again(tmp_path):
    import optuna

    from tests.fake_studies import open_fake_study
    from tuner.problem import Problem
    from tuner.space import load_space
    from tuner.study import requeue_stale

    space = load_space("sm80")
    study = open_fake_study(
        f"sqlite:///{tmp_path}/s.db", "s", space, Problem(batch=1, seqlen_q=128, heads_q=2, head_dim=64)
    )
    trial = study.ask()  # the enqueued default, not drawn yet: its params are empty
    assert not trial.params
    frozen = study._storage.get_trial(trial._trial_id)
    requeue_stale(study, frozen)
    [again] = [t for t in study.get_trials() if t.state == optuna.trial.TrialState.WAITING]
    assert again.system_attrs["fixed_params"] == space.defaults(64) and again.user_attrs["is_default"]


def test_an_owner_record_tells_a_live_process_from_a_dead_one():
    import subprocess
    import sys

    from tuner.study import owner_alive, this_process

    me = this_process()
    assert owner_alive(me) is True
    assert owner_alive({**me, "started": "-1"}) is False  # the pid now belongs to another process
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert owner_alive({**me, "pid": int(done.stdout), "started": "1"}) is False
    assert owner_alive({**me, "host": "elsewhere"}) is None  # another host: go by its beats
    assert owner_alive(None) is None and owner_alive({"pid": "1"}) is None


@pytest.mark.parametrize("text", ["nan", "inf", "1e400", "100000000"])
def test_absurd_periods_keep_the_default(monkeypatch, capsys, text):
    monkeypatch.setenv("FLASHTUNE_GRACE_PERIOD_S", text)
    assert _seconds_from_env("FLASHTUNE_GRACE_PERIOD_S", 60) == 60
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("flashtune: warning: ") and "seconds from 1 to 86400" in lines[0]
