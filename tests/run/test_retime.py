"""tuner.retime: interleaved re-timing of the top configs and the default; the stored winner."""

from __future__ import annotations

import json
import statistics

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

import tuner.study as st
from tests.fakes.fake_compile import fake_compiler
from tests.fakes.fake_measure import FakeMeasure, KnownSpeedupMeasure, model_tflops
from tuner.gpu import MeasureResult
from tuner.run import DEFAULT_NOISE_FLOOR, TuneSettings, compare, retime_top, tune, within_noise_of_best
from tuner.search import make_sampler, make_search
from tuner.space import config_key
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

    # each candidate x 3 rounds, round-robin, the order rotated by one each round, each checked on new inputs
    n = len(contenders)
    assert len(measure.calls) == 3 * n
    first_round = [job.tag for job in measure.calls[:n]]
    assert len(set(first_round)) == n
    for r in range(3):
        assert [job.tag for job in measure.calls[r * n : (r + 1) * n]] == first_round[r:] + first_round[:r]
    assert all(job.settings.check and job.settings.fresh_inputs and job.settings.timing for job in measure.calls)
    assert entry["rejected"] == []
    assert all(job.tag.startswith("retime-") for job in measure.calls)
    # no noise: BEST's 10% lead is far beyond the floor
    assert entry["beats_default"] is True and entry["is_default"] is False
    assert entry["margin"] == pytest.approx(DEFAULT_NOISE_FLOOR) and entry["noise_floor"] == DEFAULT_NOISE_FLOOR
    assert entry["best_trial"] == _number(tuned, BEST)


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
    # the best is a candidate whatever the cap says
    assert within_noise_of_best([], 5) == []
    assert [t.value for t in within_noise_of_best(ranked, 0)] == [100.0]
    assert [t.value for t in within_noise_of_best(ranked, 1)] == [100.0]
    # a confidence half-width from the worker takes precedence over the spread
    ci = [
        optuna.trial.create_trial(value=v, user_attrs={st.MEASUREMENT: {"spread": 0.5, "rel_ci": c}})
        for v, c in ((100.0, 0.002), (97.0, 0.002), (96.0, 0.002))
    ]
    assert [t.value for t in within_noise_of_best(ci, 5)] == [100.0, 97.0]


# -- the verdict against the default: a win only beyond the measured noise and the floor -----------------
def _known(toy_space, **kwargs):
    """A re-timing measure where BEST and SECOND are the given factors from the default (others 0.9)."""
    speedups = {config_key(BEST): kwargs.pop("best"), config_key(SECOND): kwargs.pop("second", 0.95)}
    return KnownSpeedupMeasure(default=toy_space.defaults(), speedups=speedups, **kwargs)


def _retime(tuned, toy_space, problem, sm80, measure, **kwargs):
    kwargs.setdefault("top_k", 3)
    kwargs.setdefault("rounds", 5)
    return retime_top(tuned, toy_space, problem, sm80, measure, compiler=fake_compiler, **kwargs)


def test_a_clear_winner_is_stored(tuned, toy_space, problem, sm80):
    for seed in range(5):
        measure = _known(toy_space, best=1.10, rel_noise=0.01, noise_seed=seed)
        entry = _retime(tuned, toy_space, problem, sm80, measure, seed=seed)
        assert entry["config"] == BEST and entry["beats_default"] is True and entry["is_default"] is False
        assert entry["speedup_over_default"] == pytest.approx(1.10, abs=0.03)
        assert DEFAULT_NOISE_FLOOR <= entry["margin"] < entry["speedup_over_default"] - 1
        [best] = [c for c in entry["candidates"] if c["trial"] == entry["trial"]]
        assert best["speedup_low"] > 1 + DEFAULT_NOISE_FLOOR / 2 and best["beats_default"] is True
        assert len(best["samples_ms"]) == 5
        assert st.winner_verdict(entry).endswith(f"the default, beyond noise (±{entry['margin']:.1%})")
        assert st.winner(tuned)["config"] == BEST


def test_a_lead_within_noise_keeps_the_default(tuned, toy_space, problem, sm80):
    # a 0.5% "winner" timed with 2% noise: the default is stored, though the fastest median is often BEST
    default, fastest = toy_space.defaults(), 0
    for seed in range(10):
        measure = _known(toy_space, best=1.005, rel_noise=0.02, noise_seed=seed)
        entry = _retime(tuned, toy_space, problem, sm80, measure, seed=seed)
        assert entry["config"] == default and entry["trial"] == st.default_trial(tuned).number
        assert entry["beats_default"] is False and entry["is_default"] is True
        assert entry["speedup_over_default"] == 1.0
        assert entry["challenger"]["trial"] in {_number(tuned, BEST), _number(tuned, SECOND)}
        assert entry["margin"] == entry["challenger"]["margin"] >= DEFAULT_NOISE_FLOOR
        [kept] = [c for c in entry["candidates"] if c["trial"] == entry["trial"]]
        assert entry["latency_ms"] == pytest.approx(statistics.median(kept["samples_ms"]))
        assert entry["tflops"] == pytest.approx(problem.flops / (entry["latency_ms"] * 1e-3) / 1e12)
        verdict = st.winner_verdict(entry)
        assert verdict.startswith(f"no config beats the default beyond noise (±{entry['margin']:.1%})")
        assert st.winner(tuned)["config"] == default
        fastest += min(entry["candidates"], key=lambda c: c["latency_ms"])["trial"] != entry["trial"]
    assert fastest >= 3  # not vacuous: the fastest median alone would have stored the noise


def test_the_measured_noise_sets_the_margin_when_it_is_above_the_floor(tuned, toy_space, problem, sm80):
    # a 6% lead clears the 3% floor when timings are precise, not when each one is 8% off
    precise = _retime(tuned, toy_space, problem, sm80, _known(toy_space, best=1.06, rel_noise=0.002), rounds=7)
    assert precise["config"] == BEST and precise["margin"] == pytest.approx(DEFAULT_NOISE_FLOOR)
    noisy = _retime(tuned, toy_space, problem, sm80, _known(toy_space, best=1.06, rel_noise=0.08), rounds=7)
    assert noisy["beats_default"] is False and noisy["config"] == toy_space.defaults()
    assert noisy["margin"] > 0.06 > DEFAULT_NOISE_FLOOR


def test_the_noise_floor_is_a_setting(tuned, toy_space, problem, sm80):
    # a steady 2% lead: below the default floor, a win with a floor of 1%
    measure = _known(toy_space, best=1.02, rel_noise=0.001)
    assert _retime(tuned, toy_space, problem, sm80, measure)["beats_default"] is False
    entry = _retime(tuned, toy_space, problem, sm80, _known(toy_space, best=1.02, rel_noise=0.001), noise_floor=0.01)
    assert entry["config"] == BEST and entry["margin"] == pytest.approx(0.01) and entry["noise_floor"] == 0.01
    with pytest.raises(ValueError, match="noise_floor"):
        _retime(tuned, toy_space, problem, sm80, FakeMeasure(), noise_floor=1.5)


def test_pairing_by_round_cancels_drift_common_to_every_config(tuned, toy_space, problem, sm80):
    # the GPU slows 0.8% a call, over 15% during the re-timing: each round's pair shares most of it, so a
    # 7% lead stands
    measure = _known(toy_space, best=1.07, drift=0.008)
    entry = _retime(tuned, toy_space, problem, sm80, measure, rounds=6)
    assert entry["config"] == BEST and entry["margin"] < 0.06
    samples = next(c["samples_ms"] for c in entry["candidates"] if c["trial"] == entry["trial"])
    assert max(samples) / min(samples) > 1.1  # unpaired, the spread would swamp the lead


def test_among_several_winners_the_largest_speedup_wins(tuned, toy_space, problem, sm80):
    entry = _retime(tuned, toy_space, problem, sm80, _known(toy_space, best=1.08, second=1.15))
    assert entry["config"] == SECOND and entry["speedup_over_default"] == pytest.approx(1.15)


@pytest.mark.parametrize("top_k", [0, 1, 2])
def test_the_best_trial_is_always_retimed(tuned, toy_space, problem, sm80, top_k):
    measure = _known(toy_space, best=1.10)
    entry = _retime(tuned, toy_space, problem, sm80, measure, top_k=top_k, rounds=2)
    timed = {c["trial"] for c in entry["candidates"]}
    assert _number(tuned, BEST) in timed and st.default_trial(tuned).number in timed
    assert len(timed) == max(2, top_k + 1) and entry["best_trial"] == _number(tuned, BEST)
    assert sum(job.config == BEST for job in measure.calls) == 2
    assert entry["config"] == BEST


def test_the_best_trial_is_retimed_whatever_its_figure(tuned, toy_space, problem, sm80):
    # a trial that measured far ahead (a lucky first measurement) is re-timed, and loses to the default
    lucky = dict(BEST, block_n=32)
    tuned.add_trial(
        optuna.trial.create_trial(
            value=500.0,
            params=lucky,
            distributions=tuned.get_trials()[0].distributions,
            user_attrs={st.MEASUREMENT: {"spread": 0.0}},
        )
    )
    measure = _known(toy_space, best=1.10)
    entry = _retime(tuned, toy_space, problem, sm80, measure, top_k=1)
    [best] = [t for t in tuned.get_trials() if t.value == 500.0]
    assert entry["best_trial"] == best.number and any(job.config == lucky for job in measure.calls)
    assert entry["config"] == toy_space.defaults() and entry["challenger"]["speedup_over_default"] == pytest.approx(0.9)


def test_the_default_alone_is_its_own_winner(tuned, toy_space, problem, sm80):
    # every other candidate fails: the default is stored, and nothing beat it
    class OnlyDefault(FakeMeasure):
        def __call__(self, job):
            if job.config != toy_space.defaults():
                self.calls.append(job)
                return MeasureResult(status="crashed", detail="fake")
            return super().__call__(job)

    entry = _retime(tuned, toy_space, problem, sm80, OnlyDefault())
    assert entry["config"] == toy_space.defaults() and entry["beats_default"] is False
    assert entry["challenger"] is None and entry["margin"] == DEFAULT_NOISE_FLOOR
    assert len(entry["rejected"]) == len(entry["candidates"]) + len(entry["rejected"]) - 1


def test_without_the_default_nothing_is_compared(tuned, toy_space, problem, sm80):
    # the default fails a round: the fastest candidate is stored, and says nothing was compared
    class DefaultFails(FakeMeasure):
        def __call__(self, job):
            if job.config == toy_space.defaults():
                self.calls.append(job)
                return MeasureResult(status="timeout", detail="fake")
            return super().__call__(job)

    entry = _retime(tuned, toy_space, problem, sm80, DefaultFails())
    assert entry["config"] == BEST and entry["beats_default"] is None and entry["margin"] is None
    assert entry["speedup_over_default"] is None and entry["default_latency_ms"] is None
    assert "not compared" in st.winner_verdict(entry)


def _figures(entry):
    return {k: v for k, v in entry.items() if k != "date"}


def test_the_same_seed_gives_the_same_winner_and_figures(tuned, toy_space, problem, sm80):
    def run(seed):
        measure = _known(toy_space, best=1.03, rel_noise=0.02, noise_seed=7)
        entry = _retime(tuned, toy_space, problem, sm80, measure, seed=seed)
        return _figures(entry), [job.tag for job in measure.calls]

    first, order = run(11)
    again, order_again = run(11)
    assert first == again and order == order_again and first["seed"] == 11
    other, other_order = run(12)
    assert other_order != order  # the round order follows the seed
    assert other["candidates"] != first["candidates"]


def test_the_bootstrap_follows_the_seed_alone():
    samples = [1.0, 1.1, 0.95, 1.2, 1.05, 0.9, 1.0, 1.13, 0.97, 1.08]
    default = [1.1, 1.15, 1.0, 1.3, 1.1, 1.0, 1.02, 1.21, 1.04, 1.11]
    a = compare(samples, default, noise_floor=0.0, rng=np.random.default_rng(3))
    assert a == compare(samples, default, noise_floor=0.0, rng=np.random.default_rng(3))
    bounds = {
        (r.low, r.high)
        for r in (compare(samples, default, noise_floor=0.0, rng=np.random.default_rng(s)) for s in range(10))
    }
    assert len(bounds) > 1


def test_compare_is_a_paired_test_of_the_median_speedup():
    # one sample a round each; the per-round ratios are 1.10 +- 0.01: a win with a margin from their spread
    default = [1.10, 2.20, 1.65, 1.32, 0.99]
    candidate = [1.0 / 1.10 * d * r for d, r in zip(default, (1.0, 1.01, 0.99, 1.0, 1.005))]
    result = compare(candidate, default, noise_floor=0.0, rng=np.random.default_rng(0))
    ratios = sorted(d / c for d, c in zip(default, candidate))
    assert result.speedup == pytest.approx(ratios[2])
    assert ratios[0] <= result.low <= result.speedup <= result.high <= ratios[-1]
    assert (
        result.margin == result.noise == pytest.approx(max(result.speedup - result.low, result.high - result.speedup))
    )
    assert result.beats_default and result.margin < 0.02
    assert not compare(candidate, default, noise_floor=0.2, rng=np.random.default_rng(0)).beats_default
    one = compare([1.0], [1.5], noise_floor=0.03, rng=np.random.default_rng(0))
    assert one.speedup == 1.5 and one.noise == 0.0 and one.margin == 0.03 and one.beats_default
    with pytest.raises(ValueError):
        compare([1.0, 1.0], [1.0], noise_floor=0.0, rng=np.random.default_rng(0))


# -- winners stored before the verdict: read as they were -------------------------------------------------
OLD_WINNER_KEYS = {
    "config",
    "trial",
    "latency_ms",
    "tflops",
    "default_latency_ms",
    "speedup_over_default",
    "rounds",
    "seen_trials",
    "candidates",
    "rejected",
    "date",
}


def test_a_winner_stored_before_the_verdict_reads_as_it_was(tuned, toy_space, problem, sm80):
    entry = retime_top(tuned, toy_space, problem, sm80, FakeMeasure(), top_k=2, rounds=3, compiler=fake_compiler)
    old = {k: v for k, v in entry.items() if k in OLD_WINNER_KEYS}
    old["candidates"] = [{k: c[k] for k in ("trial", "latency_ms", "tflops")} for c in entry["candidates"]]
    tuned.set_user_attr(st.WINNER, old)
    served = st.winner(tuned)
    assert served == {**old, "source": "retimed"}  # nothing added, nothing changed
    assert st.winner_verdict(served) is None
    # a trial faster by anything makes an old winner stale (it stored no margin)
    tuned.add_trial(
        optuna.trial.create_trial(
            value=old["tflops"] * 1.001, params=dict(BEST, stages=1), distributions=tuned.get_trials()[0].distributions
        )
    )
    assert st.winner(tuned)["source"].startswith("best trial (newer")


def test_a_newer_trial_within_the_margin_leaves_the_winner(tuned, toy_space, problem, sm80):
    entry = _retime(tuned, toy_space, problem, sm80, _known(toy_space, best=1.005, rel_noise=0.01))
    assert entry["beats_default"] is False
    dists = tuned.get_trials()[0].distributions
    within = entry["tflops"] * (1 + entry["margin"] * 0.5)
    tuned.add_trial(optuna.trial.create_trial(value=within, params=dict(BEST, stages=1), distributions=dists))
    assert st.winner(tuned)["source"] == "retimed"
    beyond = entry["tflops"] * (1 + entry["margin"] * 1.5)
    tuned.add_trial(optuna.trial.create_trial(value=beyond, params=dict(BEST, stages=3), distributions=dists))
    assert st.winner(tuned)["source"].startswith("best trial (newer")
