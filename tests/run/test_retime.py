"""tuner.retime: interleaved re-timing of the top configs and the default; the stored winner."""

from __future__ import annotations

import json

import optuna
import pytest
from optuna.trial import TrialState

import tuner.study as st
from tests.fakes.fake_compile import fake_compiler
from tests.fakes.fake_measure import FakeMeasure, model_tflops
from tuner.gpu import MeasureResult
from tuner.run import TuneSettings, retime_top, tune, within_noise_of_best
from tuner.search import make_sampler, make_search
from tuner.study import open_storage

GPU = {"name": "Fake GPU", "arch": 80}
BEST = {"block_m": 128, "block_n": 64, "stages": 2, "flag": 1}  # the model's unique optimum
SECOND = {"block_m": 128, "block_n": 64, "stages": 2, "flag": 0}


@pytest.fixture
def tuned(sqlite_url, toy_space, problem, sm80):
    storage = open_storage(sqlite_url)
    study = st.open_study(
        storage=storage,
        name="s",
        space=toy_space,
        problem=problem,
        gpu=GPU,
        sampler=make_sampler("random", toy_space, 1),
    )
    study.enqueue_trial(BEST)
    study.enqueue_trial(SECOND)
    tune(
        study,
        toy_space,
        problem,
        sm80,
        FakeMeasure(),
        TuneSettings(n_trials=8, compile_workers=1),
        compiler=fake_compiler,
        search=make_search("random", toy_space, problem, sm80, 1),
    )
    return study


def _number(study, config):
    return next(t.number for t in study.get_trials() if t.params == config and st.DUPLICATE_OF not in t.user_attrs)


def test_retime_stores_the_winner_with_speedup(tuned, toy_space, problem, sm80):
    measure = FakeMeasure()
    entry = retime_top(tuned, toy_space, problem, sm80, measure, top_k=3, rounds=3, compiler=fake_compiler)
    assert entry["config"] == BEST and entry["trial"] == _number(tuned, BEST)
    best_ms = problem.flops / (model_tflops(BEST) * 1e12) * 1e3
    default_ms = problem.flops / (model_tflops(toy_space.defaults()) * 1e12) * 1e3
    assert entry["latency_ms"] == pytest.approx(best_ms)
    assert entry["tflops"] == pytest.approx(model_tflops(BEST))
    assert entry["default_latency_ms"] == pytest.approx(default_ms)
    assert entry["speedup_over_default"] == pytest.approx(model_tflops(BEST) / model_tflops(toy_space.defaults()))
    assert entry["speedup_over_default"] > 1
    assert entry["rounds"] == 3
    latencies = [c["latency_ms"] for c in entry["candidates"]]
    ranked = sorted(
        (t for t in tuned.get_trials(states=(TrialState.COMPLETE,)) if st.DUPLICATE_OF not in t.user_attrs),
        key=lambda t: t.value,
        reverse=True,
    )
    contenders = {t.number for t in within_noise_of_best(ranked, 3)} | {st.default_trial(tuned).number}
    assert latencies == sorted(latencies) and {c["trial"] for c in entry["candidates"]} == contenders
    assert json.loads(json.dumps(entry)) == tuned.user_attrs["winner"]
    assert st.winner(tuned) == {**entry, "source": "retimed"}

    # each candidate x 3 rounds, round-robin, each checked again on new inputs
    n = len(contenders)
    assert len(measure.calls) == 3 * n
    first_round = [job.tag for job in measure.calls[:n]]
    assert len(set(first_round)) == n and [job.tag for job in measure.calls[n : 2 * n]] == first_round
    assert all(job.settings.check and job.settings.fresh_inputs and job.settings.timing for job in measure.calls)
    assert entry["rejected"] == []
    assert all(job.tag.startswith("retime-") for job in measure.calls)


def test_retime_uses_the_median_of_rounds(tuned, toy_space, problem, sm80):
    class Noisy(FakeMeasure):
        """The best config has one very lucky round; the second best is steady."""

        def __call__(self, job):
            result = super().__call__(job)
            rounds = sum(1 for j in self.calls if j.config == job.config)
            if job.config == SECOND and rounds == 1:
                return MeasureResult(status="ok", latency_ms=result.latency_ms / 10, tflops=result.tflops * 10)
            return result

    entry = retime_top(tuned, toy_space, problem, sm80, Noisy(), top_k=2, rounds=3, compiler=fake_compiler)
    assert entry["config"] == BEST


def test_a_config_failing_a_round_is_not_a_candidate(tuned, toy_space, problem, sm80):
    class FailsBest(FakeMeasure):
        def __call__(self, job):
            result = super().__call__(job)
            if job.config == BEST and sum(j.config == BEST for j in self.calls) == 2:
                return MeasureResult(status="timeout", detail="hung (fake)")
            return result

    entry = retime_top(tuned, toy_space, problem, sm80, FailsBest(), top_k=2, rounds=3, compiler=fake_compiler)
    assert entry["config"] == SECOND
    assert all(c["trial"] != _number(tuned, BEST) for c in entry["candidates"])


def test_a_config_wrong_on_new_inputs_is_rejected(tuned, toy_space, problem, sm80):
    class WrongOnNewInputs(FakeMeasure):
        def __call__(self, job):
            if job.config == BEST and job.settings.fresh_inputs:
                self.calls.append(job)
                return MeasureResult(status="wrong_result", detail="O relative error 0.5 > 0.002 (fake)")
            return super().__call__(job)

    measure = WrongOnNewInputs()
    entry = retime_top(tuned, toy_space, problem, sm80, measure, top_k=2, rounds=3, compiler=fake_compiler)
    assert entry["config"] == SECOND
    assert entry["rejected"] == [
        {"trial": _number(tuned, BEST), "status": "wrong_result", "detail": "O relative error 0.5 > 0.002 (fake)"}
    ]
    assert sum(job.config == BEST for job in measure.calls) == 1  # not measured again once out


def test_a_config_that_no_longer_compiles_is_skipped(tuned, toy_space, problem, sm80):
    def compiler(space_path, config, problem, device):
        if config == BEST:
            from tuner.compile import CompileOutcome

            return CompileOutcome(status="compile_error", reason="gone")
        return fake_compiler(space_path, config, problem, device)

    entry = retime_top(tuned, toy_space, problem, sm80, FakeMeasure(), top_k=2, rounds=2, compiler=compiler)
    assert entry["config"] == SECOND


def test_no_complete_trial_gives_no_winner(sqlite_url, toy_space, problem, sm80):
    storage = open_storage(sqlite_url)
    study = st.open_study(
        storage=storage,
        name="s",
        space=toy_space,
        problem=problem,
        gpu=GPU,
        sampler=make_sampler("random", toy_space, 1),
    )
    assert retime_top(study, toy_space, problem, sm80, FakeMeasure(), compiler=fake_compiler) is None
    assert "winner" not in study.user_attrs


def test_nothing_timed_gives_no_winner(tuned, toy_space, problem, sm80):
    def always_fails(job):
        return MeasureResult(status="crashed", detail="fake")

    assert retime_top(tuned, toy_space, problem, sm80, always_fails, compiler=fake_compiler) is None
    assert "winner" not in tuned.user_attrs


def test_retime_leaves_trials_alone(tuned, toy_space, problem, sm80):
    before = [(t.number, t.state, t.value, t.user_attrs) for t in tuned.get_trials()]
    retime_top(tuned, toy_space, problem, sm80, FakeMeasure(), compiler=fake_compiler)
    assert [(t.number, t.state, t.value, t.user_attrs) for t in tuned.get_trials()] == before
    assert all(t.state != TrialState.RUNNING for t in tuned.get_trials())


def _ranked(*values_and_spreads):
    trials = [
        optuna.trial.create_trial(value=v, user_attrs={st.MEASUREMENT: {"spread": s}}) for v, s in values_and_spreads
    ]
    return sorted(trials, key=lambda t: t.value, reverse=True)


def test_the_candidates_are_the_trials_within_the_noise_of_the_best():
    # precise timings (spread 0: the 1% floor each): within 2% of the best is a contender
    ranked = _ranked((100.0, 0.0), (98.5, 0.0), (97.9, 0.0), (90.0, 0.0))
    assert [t.value for t in within_noise_of_best(ranked, 10)] == [100.0, 98.5]
    # noisy timings widen the band: spread 0.08 -> +-4% each
    noisy = _ranked((100.0, 0.08), (93.0, 0.08), (91.0, 0.0), (80.0, 0.08))
    assert [t.value for t in within_noise_of_best(noisy, 10)] == [100.0, 93.0]  # 91 is precise: +-1%
    # the cap, and at least the runner-up even when it is far behind
    assert len(within_noise_of_best(noisy, 2)) == 2
    assert [t.value for t in within_noise_of_best(_ranked((100.0, 0.0), (50.0, 0.0)), 5)] == [100.0, 50.0]
    assert within_noise_of_best([], 5) == [] and within_noise_of_best(ranked, 0) == []
    # a confidence half-width from the worker takes precedence over the spread
    ci = [
        optuna.trial.create_trial(value=v, user_attrs={st.MEASUREMENT: {"spread": 0.5, "rel_ci": c}})
        for v, c in ((100.0, 0.002), (97.0, 0.002), (96.0, 0.002))
    ]
    assert [t.value for t in within_noise_of_best(ci, 5)] == [100.0, 97.0]
