"""The tuning loop: ask → static check → compile ahead on CPU processes → measure on the GPU → tell.

While the GPU measures trial k, trials k+1 .. k+n compile in a process pool. A config that
is statically infeasible, fails to compile, computes a wrong result, hangs or crashes is told
to Optuna as PRUNED with its reason, so the sampler learns to avoid it and the study goes on.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import multiprocessing as mp
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from . import study as st
from .compile import CompiledKernel, CompileError, compile_config
from .devices import DeviceLimits
from .jobs import MeasureJob, MeasureResult, MeasureSettings
from .problem import Problem
from .search import distributions
from .space import Config, Space, config_key, load_space

__all__ = ["CompileOutcome", "default_compile_workers", "TuneSettings", "TuneSummary", "compile_outcome", "measure_job_for", "tune"]


def default_compile_workers() -> int:
    """Leave one core to the tuner and the GPU worker; more than 8 nvcc processes rarely pay."""
    return max(1, min(8, (os.cpu_count() or 2) - 1))


@dataclass(frozen=True, kw_only=True)
class TuneSettings:
    n_trials: int | None = 50  # evaluated trials the study should hold in total (a resumed study counts its own)
    timeout_s: float | None = None  # wall-clock budget of this run
    compile_workers: int = field(default_factory=default_compile_workers)
    compile_ahead: int = 4
    compile_timeout_s: float = 600.0
    trial_timeout_s: float = 120.0
    max_idle_asks: int = 200  # consecutive asks that measure nothing before the space counts as exhausted
    measure: MeasureSettings = field(default_factory=MeasureSettings)


@dataclass(frozen=True, kw_only=True)
class CompileOutcome:
    status: Literal["ok", "compile_error"]
    kernel: CompiledKernel | None = None
    reason: str = ""


@dataclass
class TuneSummary:
    evaluated: int = 0  # configs that passed the static check and were compiled (and measured)
    infeasible: int = 0
    failed: int = 0
    duplicates: int = 0
    stopped_because: str = ""
    best_tflops: float | None = None


@functools.lru_cache(maxsize=8)
def _space(path: str) -> Space:
    return load_space(path)


def compile_outcome(space_path: str, config: Config, problem: Problem, device: DeviceLimits) -> CompileOutcome:
    """Compile in a pool process; never raises (a failure is an outcome)."""
    try:
        return CompileOutcome(status="ok", kernel=compile_config(_space(space_path), config, problem, device))
    except CompileError as e:
        return CompileOutcome(status="compile_error", reason=str(e))
    except Exception as e:  # noqa: BLE001 - e.g. a full disk or a ptxas report we cannot read
        return CompileOutcome(status="compile_error", reason=f"{type(e).__name__}: {e}")


def measure_job_for(space: Space, config: Config, problem: Problem, device: DeviceLimits, kernel: CompiledKernel,
                    settings: MeasureSettings, tag: str = "") -> MeasureJob:
    geometry = space.launch(config, problem, device)
    return MeasureJob(cubin_path=kernel.cubin_path, entry=kernel.entry, abi=space.family.abi, grid=geometry.grid,
                      threads=geometry.threads, smem_bytes=geometry.smem_bytes, problem=problem, config=dict(config),
                      settings=settings, tag=tag)


@dataclass
class _Pending:
    trial: Trial
    config: Config
    future: cf.Future
    submitted: float


def tune(study: optuna.Study, space: Space, problem: Problem, device: DeviceLimits,
         measure: Callable[[MeasureJob], MeasureResult], settings: TuneSettings, *,
         compiler: Callable[..., CompileOutcome] = compile_outcome,
         progress: Callable[[dict[str, Any]], None] | None = None) -> TuneSummary:
    """Run trials until ``settings.n_trials`` measured trials exist, the time is up, or the space is exhausted."""
    dists = distributions(space)
    seen: dict[str, FrozenTrial] = st.finished_by_config(study)
    summary = TuneSummary(evaluated=_evaluated(study))
    deadline = time.monotonic() + settings.timeout_s if settings.timeout_s else None
    pending: deque[_Pending] = deque()
    idle_asks = 0
    ctx = mp.get_context("spawn")
    pool = cf.ProcessPoolExecutor(max_workers=settings.compile_workers, mp_context=ctx)

    def budget_left() -> bool:
        if settings.n_trials is not None and summary.evaluated + len(pending) >= settings.n_trials:
            return False
        return deadline is None or time.monotonic() < deadline

    def report(event: str) -> None:
        best = _best(study)
        summary.best_tflops = best
        if progress:
            progress({"event": event, "evaluated": summary.evaluated, "target": settings.n_trials,
                      "best_tflops": best, "compiling": len(pending), "infeasible": summary.infeasible,
                      "failed": summary.failed})

    try:
        while True:
            # keep the compile queue full
            while len(pending) < settings.compile_ahead and budget_left() and idle_asks < settings.max_idle_asks:
                trial = study.ask(dists)
                config = space.validate(trial.params)
                key = config_key(config)
                trial.set_user_attr(st.CONFIG_KEY, key)
                if key in seen:
                    _tell_duplicate(study, trial, seen[key])
                    summary.duplicates += 1
                    idle_asks += 1
                    continue
                reason = space.check(config, problem, device)
                if reason:
                    seen[key] = _tell_pruned(study, trial, "infeasible", reason)
                    summary.infeasible += 1
                    idle_asks += 1
                    report("infeasible")
                    continue
                idle_asks = 0
                future = pool.submit(compiler, str(space.path), config, problem, device)
                pending.append(_Pending(trial, config, future, time.monotonic()))
            if not pending:
                if idle_asks >= settings.max_idle_asks:
                    summary.stopped_because = f"no new feasible config in {idle_asks} proposals: space exhausted"
                elif settings.n_trials is not None and summary.evaluated >= settings.n_trials:
                    summary.stopped_because = f"{summary.evaluated} evaluated trials reached"
                else:
                    summary.stopped_because = "time budget used"
                break
            item = pending.popleft()
            seen[config_key(item.config)] = _run_one(study, space, problem, device, measure, settings, item, summary)
            report("trial")
    finally:
        for item in pending:  # interrupted: leave nothing RUNNING
            item.future.cancel()
            item.trial.set_user_attr(st.STATUS, "interrupted")
            study.tell(item.trial, state=TrialState.FAIL)
        pool.shutdown(wait=False, cancel_futures=True)
    report("done")
    return summary


def _run_one(study: optuna.Study, space: Space, problem: Problem, device: DeviceLimits,
             measure: Callable[[MeasureJob], MeasureResult], settings: TuneSettings, item: _Pending,
             summary: TuneSummary) -> FrozenTrial:
    trial = item.trial
    remaining = settings.compile_timeout_s - (time.monotonic() - item.submitted)
    summary.evaluated += 1
    try:
        outcome: CompileOutcome = item.future.result(timeout=max(1.0, remaining))
    except cf.TimeoutError:
        summary.failed += 1
        return _tell_pruned(study, trial, "compile_timeout", f"compile took over {settings.compile_timeout_s:.0f} s")
    except cf.process.BrokenProcessPool as e:
        summary.failed += 1
        return _tell_pruned(study, trial, "compile_error", f"compile process died: {e}")
    if outcome.status != "ok" or outcome.kernel is None:
        summary.failed += 1
        return _tell_pruned(study, trial, outcome.status, outcome.reason)
    kernel = outcome.kernel
    trial.set_user_attr(st.RESOURCES, kernel.resources.to_dict())
    trial.set_user_attr(st.COMPILE, {"seconds": round(kernel.seconds, 3), "cached": kernel.cached, "arch": kernel.arch})
    job = measure_job_for(space, item.config, problem, device, kernel, settings.measure, tag=f"trial-{trial.number}")
    result = measure(job)
    trial.set_user_attr(st.MEASUREMENT, {k: v for k, v in result.to_dict().items() if k not in ("status", "detail")})
    if not result.ok:
        summary.failed += 1
        return _tell_pruned(study, trial, result.status, result.detail)
    trial.set_user_attr(st.STATUS, "ok")
    return study.tell(trial, result.tflops)


def _tell_pruned(study: optuna.Study, trial: Trial, status: str, reason: str) -> FrozenTrial:
    trial.set_user_attr(st.STATUS, status)
    trial.set_user_attr(st.REASON, reason[:1000])
    return study.tell(trial, state=TrialState.PRUNED)


def _tell_duplicate(study: optuna.Study, trial: Trial, original: FrozenTrial) -> None:
    """The sampler proposed a config already measured: give it the same outcome, measured once."""
    trial.set_user_attr(st.DUPLICATE_OF, original.number)
    for key in (st.STATUS, st.REASON):
        if key in original.user_attrs:
            trial.set_user_attr(key, original.user_attrs[key])
    if original.state == TrialState.COMPLETE:
        study.tell(trial, original.value)
    else:
        study.tell(trial, state=TrialState.PRUNED)


def _evaluated(study: optuna.Study) -> int:
    """Finished trials that count against the budget: all but static rejections and duplicates."""
    return sum(1 for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
               if t.user_attrs.get(st.STATUS) not in (None, "infeasible") and st.DUPLICATE_OF not in t.user_attrs)


def _best(study: optuna.Study) -> float | None:
    values = [t.value for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.value is not None]
    return max(values) if values else None
