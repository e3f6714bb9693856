"""A 20-trial study end to end on the GPU, through the command line, then resumed."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from tuner.cli import main
from tuner.study import IS_DEFAULT, MEASUREMENT, RESOURCES, STATUS

pytestmark = pytest.mark.gpu


def test_twenty_trial_study_then_resume(tmp_path, capsys):
    storage = f"sqlite:///{tmp_path}/e2e.db"
    args = [
        "tune",
        "--family",
        "sm80",
        "--batch",
        "2",
        "--seqlen",
        "1024",
        "--heads",
        "8",
        "--head-dim",
        "128",
        "--trials",
        "20",
        "--storage",
        storage,
        "--study",
        "e2e",
        "--seed",
        "1",
        "--top-k",
        "3",
        "--rounds",
        "2",
    ]
    assert main(args) == 0
    study = optuna.load_study(study_name="e2e", storage=storage)
    trials = study.get_trials(deepcopy=False)
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    evaluated = [
        t for t in trials if t.user_attrs.get(STATUS) not in (None, "infeasible") and "duplicate_of" not in t.user_attrs
    ]
    assert len(evaluated) == 20
    default = trials[0]
    assert default.user_attrs.get(IS_DEFAULT) and default.state == TrialState.COMPLETE, default.user_attrs
    for t in trials:
        if t.state == TrialState.COMPLETE and "duplicate_of" not in t.user_attrs:
            assert t.value > 1.0  # TFLOPS
            assert t.user_attrs[RESOURCES]["registers"] > 0
            m = t.user_attrs[MEASUREMENT]
            assert m["rel_error"] < 5e-3
            assert 0 < m["kernel_ms"] <= m["job_ms"] and m["rel_ci"] is not None and m["reps"] >= 10
        elif t.state == TrialState.PRUNED:
            assert t.user_attrs.get("reason") or t.user_attrs.get("duplicate_of") is not None
    # the study's inputs and reference were made once, before the first job (the GPU worker's preparation),
    # and again only after a job that may have spoilt them
    made = sum(
        (t.user_attrs[MEASUREMENT].get("phases_ms") or {}).get("inputs", 0) > 0
        for t in trials
        if isinstance(t.user_attrs.get(MEASUREMENT), dict)
    )
    remade = sum(t.user_attrs.get(STATUS) in ("wrong_result", "crashed", "launch_error", "timeout") for t in trials)
    assert made <= remade
    [run] = [v for k, v in study.user_attrs.items() if k.startswith("throughput:")]
    assert run["prepare_s"] > 0 and run["gpus"] == 1 and run["measured"] == run["measured_per_gpu"][0] > 0
    winner = study.user_attrs["winner"]
    assert winner["tflops"] > 0 and winner["speedup_over_default"] > 0
    assert winner["rejected"] == []  # every candidate is right on fresh inputs too
    assert study.user_attrs["gpu"]["name"]
    before = len(trials)
    assert main(args) == 0  # resume: the budget is already spent, nothing new is measured
    after = optuna.load_study(study_name="e2e", storage=storage).get_trials(deepcopy=False)
    assert (
        len(
            [
                t
                for t in after
                if "duplicate_of" not in t.user_attrs and t.user_attrs.get(STATUS) not in (None, "infeasible")
            ]
        )
        == 20
    )
    assert [t.params for t in after[:before]] == [t.params for t in trials]
    out = capsys.readouterr().out
    assert "TFLOPS" in out
