"""Choose the winner: re-time the top configs (and the default) interleaved over several rounds.

One trial's timing can be lucky (clock boost, a quiet neighbour). Measuring the top k again
in round-robin order, several rounds, and taking each config's median over the rounds gives
a fair comparison measured under the same conditions; the winner is stored on the study.
Every round also checks each candidate again, on new inputs: a winner must compute the right
function on inputs it was not tuned on. A candidate that fails a round is out (``rejected``).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from .. import study as st
from ..compile import compile_outcome
from ..devices import DeviceLimits
from ..gpu import MeasureJob, MeasureResult, MeasureSettings, measure_job_for
from ..problem import Problem
from ..space import Config, Space, config_key
from ._contracts import Compile

__all__ = ["retime_top"]


NOISE_FLOOR = 0.01  # two timings of one kernel differ by about this much even when each is precise


def relative_noise(trial: FrozenTrial) -> float:
    """How far a trial's figure may be off, relative: its measurement's confidence half-width when the
    worker reported one, else its interquartile spread, at least :data:`NOISE_FLOOR`."""
    m = trial.user_attrs.get(st.MEASUREMENT) or {}
    reported = m.get("rel_ci")
    if reported is None:
        reported = (m.get("spread") or 0.0) / 2
    return max(NOISE_FLOOR, float(reported))


def within_noise_of_best(ranked: list[FrozenTrial], top_k: int) -> list[FrozenTrial]:
    """The trials (best first) that may really be the best: those whose figure is within both trials'
    noise of the best one, at most ``top_k`` and at least two (when there are two), so a lucky
    measurement never names the winner alone."""
    if not ranked or top_k < 1:
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


def retime_top(
    study: optuna.Study,
    space: Space,
    problem: Problem,
    device: DeviceLimits,
    measure: Callable[[MeasureJob], MeasureResult],
    *,
    top_k: int = 5,
    rounds: int = 3,
    settings: MeasureSettings | None = None,
    compiler: Compile = compile_outcome,
) -> dict[str, Any] | None:
    """Re-time the configs that may be the best (:func:`within_noise_of_best`, at most ``top_k``) and the
    default, interleaved over ``rounds``; store and return the winner."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, not {rounds}")
    # the trials were checked on the inputs the worker kept for the study; here on new ones, each round
    settings = dataclasses.replace(settings or MeasureSettings(), check=True, fresh_inputs=True)
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
    timed, rejected = _rounds(jobs, measure, rounds)
    if not timed:
        return None
    entry = _winner_entry(study, problem, candidates, timed, rejected, space.defaults(problem.head_dim), rounds)
    study.set_user_attr(st.WINNER, entry)
    return entry


def _candidates(study: optuna.Study, space: Space, problem: Problem, top_k: int) -> dict[str, tuple[int, Config]]:
    """config key -> (trial number, config) of the trials that may be the best, and of the default's trial;
    empty when no trial completed."""
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
        default = space.defaults(problem.head_dim)
        candidates.setdefault(config_key(default), (default_trial.number, default))
    return candidates


def _rounds(
    jobs: dict[str, MeasureJob], measure: Callable[[MeasureJob], MeasureResult], rounds: int
) -> tuple[dict[str, float], dict[str, MeasureResult]]:
    """Measure every job once a round, in the same order each round: each job's median latency (ms) over
    the rounds, and the result of each job that failed a round (it is out from then on)."""
    samples: dict[str, list[float]] = {key: [] for key in jobs}
    rejected: dict[str, MeasureResult] = {}
    for _ in range(rounds):
        for key, job in jobs.items():
            if key in rejected:
                continue
            result = measure(job)
            if result.ok and result.latency_ms is not None:
                samples[key].append(result.latency_ms)
            else:
                rejected[key] = result
    return {key: statistics.median(v) for key, v in samples.items() if len(v) == rounds}, rejected


def _winner_entry(
    study: optuna.Study,
    problem: Problem,
    candidates: dict[str, tuple[int, Config]],
    timed: dict[str, float],
    rejected: dict[str, MeasureResult],
    default: Config,
    rounds: int,
) -> dict[str, Any]:
    """The study's ``winner`` attribute: the fastest re-timed config, against the default, with every candidate."""
    best_key = min(timed, key=timed.__getitem__)
    number, config = candidates[best_key]
    default_ms = timed.get(config_key(default))
    return {
        "config": config,
        "trial": number,
        "latency_ms": timed[best_key],
        "tflops": problem.flops / (timed[best_key] * 1e-3) / 1e12,
        "default_latency_ms": default_ms,
        "speedup_over_default": (default_ms / timed[best_key]) if default_ms else None,
        "rounds": rounds,
        # a faster trial completed after this re-timing makes the winner stale (study.winner)
        "seen_trials": sorted(t.number for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))),
        "candidates": [
            {"trial": candidates[k][0], "latency_ms": ms, "tflops": problem.flops / (ms * 1e-3) / 1e12}
            for k, ms in sorted(timed.items(), key=lambda kv: kv[1])
        ],
        "rejected": [
            {"trial": candidates[k][0], "status": r.status, "detail": r.detail[:300]} for k, r in rejected.items()
        ],
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
