"""Choose the winner: re-time the configs that may be the best, and the default, over interleaved rounds,
and keep a config only where it beats the default beyond the measured noise.

One trial's timing can be lucky (clock boost, a quiet neighbour), and a first measurement is off by
3-5% between runs, more than the ±1% spread within one run says. So the study's best trial, the
trials within noise of it (at most ``top_k`` in all) and the default are measured again, one after
another in each of several rounds, the order rotated each round (its first order drawn from the
seed), so that drift in clocks or temperature falls on every config alike. Each round is a pair of
samples, candidate and default, taken under the same conditions: the candidate's speedup over the
default is the median of its per-round ratios, and its noise is the spread of a bootstrap over the
rounds (seeded) of that median. A candidate beats the default when its median lead exceeds its
margin, the larger of that noise and ``noise_floor``; the fastest such candidate is the winner.
When none does, the default is the winner, stored with the margin that no config got past.

Every round also checks each candidate again, on new inputs: a winner must compute the right
function on inputs it was not tuned on. A candidate that fails a round is out (``rejected``).
"""

from __future__ import annotations

import dataclasses
import statistics
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from .. import study as st
from ..compile import compile_outcome
from ..devices import DeviceLimits
from ..gpu import MeasureJob, MeasureResult, MeasureSettings, measure_job_for
from ..problem import Problem
from ..space import Config, Space, config_key
from ._contracts import Compile

__all__ = ["CONFIDENCE", "DEFAULT_NOISE_FLOOR", "DEFAULT_ROUNDS", "Comparison", "compare", "retime_top"]


NOISE_FLOOR = 0.01  # two timings of one kernel differ by about this much even when each is precise
#: the smallest lead over the default that counts as a win, whatever the re-timing measured: the error of
#: a measurement between runs (3-5% on an H200, against ±1% within one run; issue 17)
DEFAULT_NOISE_FLOOR = 0.03
DEFAULT_ROUNDS = 5  # interleaved re-timing rounds (each one a paired sample of every candidate and the default)
CONFIDENCE = 0.95  # of the bootstrap interval of a candidate's median speedup over the default
_BOOTSTRAP_RESAMPLES = 2000
_ORDER_STREAM = 0  # seeds the first round order; each candidate's bootstrap has a stream of its own


def relative_noise(trial: FrozenTrial) -> float:
    """How far a trial's figure may be off, relative: its measurement's confidence half-width when the
    worker reported one, else its interquartile spread, at least :data:`NOISE_FLOOR`."""
    m = trial.user_attrs.get(st.MEASUREMENT) or {}
    reported = m.get("rel_ci")
    if reported is None:
        reported = (m.get("spread") or 0.0) / 2
    return max(NOISE_FLOOR, float(reported))


def within_noise_of_best(ranked: list[FrozenTrial], top_k: int) -> list[FrozenTrial]:
    """The trials (best first) that may really be the best: the best one always (whatever ``top_k``), then
    those whose figure is within both trials' noise of it, at most ``top_k`` in all and at least two
    (when there are two and ``top_k`` allows), so a lucky measurement never names the winner alone."""
    if not ranked:
        return []
    best = ranked[0]
    out = [best]
    for t in ranked[1:]:
        if len(out) >= top_k:
            break
        margin = relative_noise(best) + relative_noise(t)
        if t.value >= best.value * (1 - margin) or len(out) < 2:
            out.append(t)
    return out


@dataclass(frozen=True)
class Comparison:
    """One candidate against the default over the re-timing rounds (speedups: default time / candidate time)."""

    speedup: float  # median of the per-round ratios
    low: float  # the bootstrap interval of that median, at CONFIDENCE
    high: float
    noise: float  # the interval's larger half-width
    margin: float  # max(noise, noise floor): the lead a win needs
    beats_default: bool  # speedup - 1 > margin

    def to_dict(self) -> dict[str, Any]:
        return {
            "speedup_over_default": self.speedup,
            "speedup_low": self.low,
            "speedup_high": self.high,
            "margin": self.margin,
            "beats_default": self.beats_default,
        }


def compare(
    candidate_ms: list[float], default_ms: list[float], *, noise_floor: float, rng: np.random.Generator
) -> Comparison:
    """The paired comparison of a candidate's per-round latencies with the default's (same rounds, same
    order): median speedup, its bootstrap interval over the rounds, and whether the lead exceeds the margin."""
    if len(candidate_ms) != len(default_ms) or not candidate_ms:
        raise ValueError("a paired comparison needs one sample of each per round, and at least one round")
    ratios = np.asarray(default_ms, dtype=float) / np.asarray(candidate_ms, dtype=float)
    speedup = float(np.median(ratios))
    picks = rng.integers(0, len(ratios), size=(_BOOTSTRAP_RESAMPLES, len(ratios)))
    medians = np.median(ratios[picks], axis=1)
    tail = (1 - CONFIDENCE) / 2
    low, high = (float(q) for q in np.quantile(medians, [tail, 1 - tail]))
    noise = max(speedup - low, high - speedup, 0.0)
    margin = max(noise, noise_floor)
    return Comparison(speedup, low, high, noise, margin, speedup - 1 > margin)


def retime_top(
    study: optuna.Study,
    space: Space,
    problem: Problem,
    device: DeviceLimits,
    measure: Callable[[MeasureJob], MeasureResult],
    *,
    top_k: int = 5,
    rounds: int = DEFAULT_ROUNDS,
    noise_floor: float = DEFAULT_NOISE_FLOOR,
    seed: int | None = None,
    settings: MeasureSettings | None = None,
    compiler: Compile = compile_outcome,
) -> dict[str, Any] | None:
    """Re-time the study's best trial, the others that may be the best (:func:`within_noise_of_best`, at
    most ``top_k`` in all) and the default, interleaved over ``rounds``; store and return the winner (the
    default unless a config beats it beyond noise). ``seed`` (default: the settings' input seed) draws
    the round order and the bootstrap: the same samples and seed give the same winner and figures."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, not {rounds}")
    if not 0 <= noise_floor < 1:
        raise ValueError(f"noise_floor is a fraction from 0 to 1, not {noise_floor}")
    # the trials were checked on the inputs the worker kept for the study; here on new ones, each round
    settings = dataclasses.replace(settings or MeasureSettings(), check=True, fresh_inputs=True)
    seed = settings.seed if seed is None else seed
    candidates = _candidates(study, space, problem, top_k)
    if not candidates:
        return None
    jobs: dict[str, MeasureJob] = {}
    for key, (number, config) in candidates.items():
        compiled = compiler(str(space.path), config, problem, device)  # served by the cubin cache
        if compiled.ok and compiled.payload is not None:
            jobs[key] = measure_job_for(
                space, config, problem, device, compiled.payload, settings, tag=f"retime-{number}"
            )
    samples, rejected = _rounds(jobs, measure, rounds, seed)
    if not samples:
        return None
    default_key = config_key(space.defaults(problem=problem, device=device))
    comparisons = _comparisons(samples, default_key, noise_floor, seed)
    entry = _winner_entry(study, problem, candidates, samples, default_key, comparisons, noise_floor)
    entry["rejected"] = [
        {"trial": candidates[k][0], "status": r.status, "detail": r.detail[:300]} for k, r in rejected.items()
    ]
    entry.update(rounds=rounds, noise_floor=noise_floor, confidence=CONFIDENCE, seed=seed)
    entry["date"] = datetime.now(UTC).isoformat(timespec="seconds")
    study.set_user_attr(st.WINNER, entry)
    return entry


def _candidates(study: optuna.Study, space: Space, problem: Problem, top_k: int) -> dict[str, tuple[int, Config]]:
    """config key -> (trial number, config) of the trials that may be the best (the best one first), and of
    the default's trial; empty when no trial completed."""
    complete = sorted(
        (
            t
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if st.DUPLICATE_OF not in t.user_attrs
        ),
        key=lambda t: t.value,
        reverse=True,
    )
    if not complete:
        return {}
    candidates: dict[str, tuple[int, Config]] = {}
    for t in within_noise_of_best(complete, top_k):
        candidates.setdefault(config_key(t.params), (t.number, space.validate(t.params)))
    default_trial = st.default_trial(study)
    if default_trial is not None:
        default = space.validate(default_trial.params)  # the config the study ran as its default
        candidates.setdefault(config_key(default), (default_trial.number, default))
    return candidates


def _rounds(
    jobs: dict[str, MeasureJob], measure: Callable[[MeasureJob], MeasureResult], rounds: int, seed: int
) -> tuple[dict[str, list[float]], dict[str, MeasureResult]]:
    """Measure every job once a round, round-robin: the first order drawn from ``seed``, rotated by one
    each round, so that every job takes every place in turn. Each job's latencies (ms), one a round, of
    the jobs measured in every round; and the result of each job that failed a round (out from then on)."""
    order = list(jobs)
    np.random.default_rng((seed, _ORDER_STREAM)).shuffle(order)
    samples: dict[str, list[float]] = {key: [] for key in jobs}
    rejected: dict[str, MeasureResult] = {}
    for r in range(rounds):
        shift = r % len(order) if order else 0
        for key in order[shift:] + order[:shift]:
            if key in rejected:
                continue
            result = measure(jobs[key])
            if result.ok and result.latency_ms is not None:
                samples[key].append(result.latency_ms)
            else:
                rejected[key] = result
    return {key: v for key, v in samples.items() if len(v) == rounds}, rejected


def _comparisons(
    samples: dict[str, list[float]], default_key: str, noise_floor: float, seed: int
) -> dict[str, Comparison]:
    """Each re-timed candidate but the default against the default (none when the default was not timed in
    every round); each bootstrap draws from a stream of the seed and the candidate's config key alone, so
    the figures do not depend on which other candidates were timed."""
    if default_key not in samples:
        return {}
    return {
        key: compare(
            ms,
            samples[default_key],
            noise_floor=noise_floor,
            rng=np.random.default_rng((seed, zlib.crc32(key.encode()) + 1)),
        )
        for key, ms in samples.items()
        if key != default_key
    }


def _winner_entry(
    study: optuna.Study,
    problem: Problem,
    candidates: dict[str, tuple[int, Config]],
    samples: dict[str, list[float]],
    default_key: str,
    comparisons: dict[str, Comparison],
    noise_floor: float,
) -> dict[str, Any]:
    """The study's ``winner`` attribute: the candidate that beats the default by the largest median speedup
    (the default when none beats it beyond its margin; the fastest median when the default was not timed),
    with the decision's figures and every candidate."""
    median_ms = {key: statistics.median(v) for key, v in samples.items()}
    winners = [k for k, c in comparisons.items() if c.beats_default]
    challenger = max(comparisons, key=lambda k: comparisons[k].speedup, default=None)
    if winners:
        chosen = max(winners, key=lambda k: comparisons[k].speedup)
    elif default_key in median_ms:
        chosen = default_key
    else:
        chosen = min(median_ms, key=median_ms.__getitem__)
    number, config = candidates[chosen]
    decisive = comparisons.get(chosen) or (comparisons[challenger] if challenger else None)
    compared = default_key in median_ms
    margin = decisive.margin if decisive else noise_floor  # nothing to compare with: the floor alone
    return {
        "config": config,
        "trial": number,
        "latency_ms": median_ms[chosen],
        "tflops": _tflops(problem, median_ms[chosen]),
        "default_latency_ms": median_ms.get(default_key),
        "speedup_over_default": (comparisons[chosen].speedup if chosen in comparisons else 1.0) if compared else None,
        "is_default": chosen == default_key,
        # None: the default was not re-timed, so nothing was compared (the fastest median is stored)
        "beats_default": bool(winners) if compared else None,
        "margin": margin if compared else None,
        "challenger": {"trial": candidates[challenger][0], **comparisons[challenger].to_dict()} if challenger else None,
        "best_trial": next(iter(candidates.values()))[0],
        # a faster trial completed after this re-timing makes the winner stale (study.winner)
        "seen_trials": sorted(t.number for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))),
        "candidates": [
            {
                "trial": candidates[k][0],
                "latency_ms": ms,
                "tflops": _tflops(problem, ms),
                "samples_ms": samples[k],
                **(comparisons[k].to_dict() if k in comparisons else {}),
            }
            for k, ms in sorted(median_ms.items(), key=lambda kv: kv[1])
        ],
    }


def _tflops(problem: Problem, latency_ms: float) -> float:
    return problem.flops / (latency_ms * 1e-3) / 1e12
