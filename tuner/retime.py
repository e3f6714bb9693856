"""Choose the winner: re-time the top configs (and the default) interleaved over several rounds.

One trial's timing can be lucky (clock boost, a quiet neighbour). Measuring the top k again
in round-robin order, several rounds, and taking each config's median over the rounds gives
a fair comparison measured under the same conditions; the winner is stored on the study.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import optuna
from optuna.trial import TrialState

from . import study as st
from .devices import DeviceLimits
from .jobs import MeasureJob, MeasureResult, MeasureSettings
from .problem import Problem
from .space import Space, config_key
from .tune import CompileOutcome, compile_outcome, measure_job_for

__all__ = ["retime_top"]


def retime_top(study: optuna.Study, space: Space, problem: Problem, device: DeviceLimits,
               measure: Callable[[MeasureJob], MeasureResult], *, top_k: int = 5, rounds: int = 3,
               settings: MeasureSettings | None = None,
               compiler: Callable[..., CompileOutcome] = compile_outcome) -> dict[str, Any] | None:
    """Re-time the best ``top_k`` distinct configs plus the default; store and return the winner."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, not {rounds}")
    # every candidate was checked against the reference when its trial ran; here only time matters
    settings = dataclasses.replace(settings or MeasureSettings(), check=False)
    complete = sorted((t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                       if st.DUPLICATE_OF not in t.user_attrs), key=lambda t: t.value, reverse=True)
    if not complete:
        return None
    candidates: dict[str, tuple[int, dict[str, int]]] = {}
    for t in complete:
        if len(candidates) >= top_k:
            break
        candidates.setdefault(config_key(t.params), (t.number, space.validate(t.params)))
    default = space.defaults(problem.head_dim)
    default_trial = st.default_trial(study)
    if default_trial is not None:
        candidates.setdefault(config_key(default), (default_trial.number, default))

    jobs: dict[str, MeasureJob] = {}
    for key, (number, config) in candidates.items():
        outcome = compiler(str(space.path), config, problem, device)  # served by the cubin cache
        if outcome.status == st.TrialStatus.OK and outcome.kernel is not None:
            jobs[key] = measure_job_for(space, config, problem, device, outcome.kernel, settings, tag=f"retime-{number}")
    samples: dict[str, list[float]] = {key: [] for key in jobs}
    for _ in range(rounds):
        for key, job in jobs.items():
            result = measure(job)
            if result.ok and result.latency_ms is not None:
                samples[key].append(result.latency_ms)
    timed = {key: statistics.median(v) for key, v in samples.items() if len(v) == rounds}
    if not timed:
        return None
    best_key = min(timed, key=timed.__getitem__)
    number, config = candidates[best_key]
    default_ms = timed.get(config_key(default))
    entry = {
        "config": config,
        "trial": number,
        "latency_ms": timed[best_key],
        "tflops": problem.flops / (timed[best_key] * 1e-3) / 1e12,
        "default_latency_ms": default_ms,
        "speedup_over_default": (default_ms / timed[best_key]) if default_ms else None,
        "rounds": rounds,
        # a faster trial completed after this re-timing makes the winner stale (study.winner)
        "seen_trials": sorted(t.number for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))),
        "candidates": [{"trial": candidates[k][0], "latency_ms": ms, "tflops": problem.flops / (ms * 1e-3) / 1e12}
                       for k, ms in sorted(timed.items(), key=lambda kv: kv[1])],
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    study.set_user_attr("winner", entry)
    return entry
