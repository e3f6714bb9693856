"""The tuning loop: ask → static check → compile ahead on CPU processes → measure on the GPU → tell.

While the GPU measures trial k, trials k+1 .. k+n compile in a process pool. A config that
is statically infeasible, fails to compile, computes a wrong result, hangs or crashes is told
to Optuna as PRUNED with its reason, so the sampler learns to avoid it and the study goes on.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import functools
import multiprocessing as mp
import os
import random
import signal
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from . import study as st
from .compile import CompiledKernel, CompileError, compile_config
from .devices import DeviceLimits
from .heartbeat import HEARTBEAT_INTERVAL_S, REQUEUE_COUNT, REQUEUE_REASON, REQUEUED_FROM, Heartbeat, recover_stale
from .jobs import MeasureJob, MeasureResult, MeasureSettings
from .problem import Problem
from .search import distributions
from .space import Config, Space, config_key, load_space
from .storage import retrying

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
    explore_after_idle: int = 8  # the sampler repeated itself or proposed infeasible configs this often in a row:
    #                              enqueue an unseen feasible config
    storage_retries: int = 6  # attempts per storage operation ...
    storage_retry_delay_s: float = 1.0  # ... waiting this long after the first failure, doubling each time
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
                      abi_params=dict(geometry.abi), settings=settings, tag=tag)


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
    """Run trials until the study holds ``settings.n_trials`` evaluated trials, time is up, or the space is exhausted.

    Several processes (GPUs, hosts) may run this on one study at once: the budget, the
    de-duplication and stale-trial recovery read the shared storage, not local state.
    """
    dists = distributions(space)
    summary = TuneSummary()
    deadline = time.monotonic() + settings.timeout_s if settings.timeout_s is not None else None
    pending: deque[_Pending] = deque()
    waiting: dict[str, list[Trial]] = {}  # proposed again while pending: settled when the first one finishes
    in_hand: Trial | None = None  # asked, not yet pending or told: an interruption fails it too
    idle_asks = repeats = 0
    rng = random.Random(f"{settings.measure.seed}-{os.getpid()}")  # processes on one study explore apart
    storage_call = functools.partial(retrying, attempts=settings.storage_retries,
                                     first_delay_s=settings.storage_retry_delay_s)
    pool = _compile_pool(settings)
    heartbeat = Heartbeat(study._storage)
    last_recovery = 0.0
    state = _StudyState()

    def budget_left() -> bool:
        if deadline is not None and time.monotonic() >= deadline:
            return False
        return settings.n_trials is None or state.evaluated + state.running < settings.n_trials

    def report(event: str) -> None:
        summary.best_tflops = state.best
        if progress:
            progress({"event": event, "evaluated": state.evaluated, "target": settings.n_trials,
                      "best_tflops": state.best, "compiling": len(pending), "infeasible": summary.infeasible,
                      "failed": summary.failed})

    with warnings.catch_warnings(), heartbeat:
        # the storage beats for ask/tell trials through `heartbeat`; Optuna's warning assumes optimize()
        warnings.filterwarnings("ignore", message=".*Heartbeat.*", category=UserWarning)
        try:
            while True:
                if time.monotonic() - last_recovery > HEARTBEAT_INTERVAL_S:
                    storage_call(lambda: recover_stale(study, frozenset(dists)), what="stale-trial recovery")
                    last_recovery = time.monotonic()
                storage_call(lambda: state.refresh(study), what="reading the study")
                # keep the compile queue full
                while len(pending) < settings.compile_ahead and budget_left() and idle_asks < settings.max_idle_asks:
                    # beat before the parameters are drawn: a process killed from here on leaves a trial
                    # that recovery can see (no beat yet: its parameters are incomplete, see recover_stale)
                    trial = in_hand = storage_call(study.ask, what="asking for a trial")
                    heartbeat.hold(trial)
                    state.running += 1
                    config = space.validate(storage_call(lambda: _draw(trial, dists), what="drawing parameters"))
                    key = config_key(config)
                    if key in state.seen:
                        _finish_duplicate(study, trial, state.seen[key], storage_call)
                        in_hand = None
                        summary.duplicates += 1
                        idle_asks += 1
                        repeats += 1
                    elif any(config_key(p.config) == key for p in pending):
                        waiting.setdefault(key, []).append(trial)
                        in_hand = None
                        summary.duplicates += 1
                        idle_asks += 1
                        continue
                    elif (reason := space.check(config, problem, device)) is not None:
                        state.seen[key] = _finish(study, trial, storage_call, status="infeasible", reason=reason)
                        in_hand = None
                        summary.infeasible += 1
                        idle_asks += 1
                        repeats += 1
                        report("infeasible")
                    else:
                        idle_asks = repeats = 0
                        try:
                            future = pool.submit(compiler, str(space.path), config, problem, device)
                        except cf.process.BrokenProcessPool:  # a compile process was killed (OOM, say): renew
                            pool.shutdown(wait=False, cancel_futures=True)
                            pool = _compile_pool(settings)
                            future = pool.submit(compiler, str(space.path), config, problem, device)
                        pending.append(_Pending(trial, config, future, time.monotonic()))
                        in_hand = None
                        continue
                    heartbeat.release(trial)
                    state.running -= 1
                    if repeats >= settings.explore_after_idle:
                        # a converged sampler, or one lost in the infeasible part of the space: widen the search
                        taken = state.seen.keys() | state.running_elsewhere | {config_key(p.config) for p in pending}
                        unseen = _unseen_feasible(space, problem, device, taken, rng)
                        if unseen is not None:
                            storage_call(lambda: study.enqueue_trial(unseen, user_attrs={st.EXPLORATION: True}),
                                         what="enqueuing an unseen config")
                        repeats = 0
                if not pending and _others_may_finish(state, settings, deadline, idle_asks):
                    time.sleep(HEARTBEAT_INTERVAL_S)  # trials held elsewhere: they finish, or go stale and return
                    continue
                if not pending:
                    if idle_asks >= settings.max_idle_asks:
                        summary.stopped_because = f"no new feasible config in {idle_asks} proposals: space exhausted"
                    elif deadline is not None and time.monotonic() >= deadline:
                        summary.stopped_because = "time budget used"
                    else:
                        summary.stopped_because = f"the study holds {state.evaluated} evaluated trials"
                    break
                item = pending[0]  # stays pending until told, so that an interruption fails it too
                frozen = _run_one(study, space, problem, device, measure, settings, item, summary, storage_call)
                pending.popleft()
                heartbeat.release(item.trial)
                state.seen[config_key(item.config)] = frozen
                for duplicate in waiting.pop(config_key(item.config), []):
                    _finish_duplicate(study, duplicate, frozen, storage_call)
                    heartbeat.release(duplicate)
                report("trial")
        finally:
            for item in pending:
                item.future.cancel()
            held: list[tuple[Trial, Config | None, bool]] = [(item.trial, item.config, True) for item in pending]
            held += [(t, None, False) for ts in waiting.values() for t in ts]  # their config is pending above
            if in_hand is not None:  # an enqueued config (the default, say) is known before it is drawn
                held.append((in_hand, None, True))
            cleanup_call = functools.partial(retrying, attempts=3, first_delay_s=settings.storage_retry_delay_s)
            with _ctrl_c_deferred():
                _stop_cleanly(study, held, cleanup_call)
            pool.shutdown(wait=False, cancel_futures=True)
    storage_call(lambda: state.refresh(study), what="reading the study")
    report("done")
    return summary


def _stop_cleanly(study: optuna.Study, held: list[tuple[Trial, Config | None, bool]],
                  storage_call: Callable[..., Any]) -> None:
    """Fail every trial this tuner holds as interrupted, and enqueue again, right after its trial is
    failed, each config that was drawn but not measured (``(trial, config, requeue)``; config None
    with requeue: the trial's enqueued config, if it had one). Nothing is left RUNNING and nothing
    drawn is lost; a trial another tuner already failed (as stale) is left to that tuner's recovery,
    which enqueued it again itself."""
    for trial, config, requeue in held:
        try:
            if requeue and config is None:
                config = study._storage.get_trial(trial._trial_id).system_attrs.get("fixed_params")
            frozen = _finish(study, trial, storage_call, status="interrupted", reason="the tuner stopped",
                             state=TrialState.FAIL)
            if requeue and config is not None and frozen.user_attrs.get(st.STATUS) == "interrupted":
                storage_call(lambda: _requeue_interrupted(study, frozen, config),
                             what=f"enqueuing trial {trial.number}'s config again")
        except Exception:  # noqa: BLE001 - the storage is gone: the heartbeat lets others recover it
            pass


def _requeue_interrupted(study: optuna.Study, trial: FrozenTrial, config: Config) -> None:
    """Enqueue the config of a trial the tuner stopped before measuring, keeping its role (the
    default config stays the default, so the study still shows its speedup over it) and its count
    of re-enqueues after lost workers (so a config that keeps killing them still runs out)."""
    kept = {k: v for k, v in trial.user_attrs.items() if k in (st.IS_DEFAULT, st.EXPLORATION, REQUEUE_COUNT)}
    study.enqueue_trial(dict(config), user_attrs={
        REQUEUED_FROM: trial.number, REQUEUE_REASON: f"trial {trial.number} was interrupted", **kept,
    }, skip_if_exists=False)


@contextlib.contextmanager
def _ctrl_c_deferred():
    """Hold a first Ctrl-C while the tuner stores how it stopped, then deliver it; a second one quits at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []

    def on_ctrl_c(signum, frame):
        caught.append(signum)
        if len(caught) > 1:
            raise KeyboardInterrupt
        print("flashtune: storing how the tuner stopped; Ctrl-C again to quit now", file=sys.stderr, flush=True)

    previous = signal.signal(signal.SIGINT, on_ctrl_c)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def _unseen_feasible(space: Space, problem: Problem, device: DeviceLimits, taken: set[str],
                     rng: random.Random, tries: int = 10_000) -> Config | None:
    """A random statically feasible config not evaluated yet, or None when none turns up.

    ``tries`` covers sparse spaces: at sm90 d256 about 0.08% of the grid is feasible, so 10,000
    draws (half a second) find one with probability 0.9996.
    """
    for _ in range(tries):
        config = {k.name: rng.choice(k.values) for k in space.knobs}
        if config_key(config) not in taken and space.check(config, problem, device) is None:
            return config
    return None


def _draw(trial: Trial, dists: dict[str, Any]) -> dict[str, Any]:
    """Sample (or, for an enqueued trial, read back) every knob; repeating it is harmless."""
    return {name: trial.suggest_categorical(name, dist.choices) for name, dist in dists.items()}


def _compile_pool(settings: TuneSettings) -> cf.ProcessPoolExecutor:
    return cf.ProcessPoolExecutor(max_workers=settings.compile_workers, mp_context=mp.get_context("spawn"))


class _StudyState:
    """What the loop needs to know about the shared study, re-read from storage each round."""

    def __init__(self) -> None:
        self.seen: dict[str, FrozenTrial] = {}
        self.evaluated = 0
        self.running = 0
        self.running_elsewhere: set[str] = set()  # configs of RUNNING trials (exploration leaves them alone)
        self.best: float | None = None

    def refresh(self, study: optuna.Study) -> None:
        trials = study.get_trials(deepcopy=False)
        self.seen = st.finished_by_config(study, trials)
        self.evaluated = sum(1 for t in trials if _counts(t))
        self.running = sum(1 for t in trials if t.state == TrialState.RUNNING)
        self.running_elsewhere = {config_key(t.params) for t in trials if t.state == TrialState.RUNNING and t.params}
        values = [t.value for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
        self.best = max(values) if values else None


def _run_one(study: optuna.Study, space: Space, problem: Problem, device: DeviceLimits,
             measure: Callable[[MeasureJob], MeasureResult], settings: TuneSettings, item: _Pending,
             summary: TuneSummary, storage_call: Callable[..., Any]) -> FrozenTrial:
    trial = item.trial
    remaining = settings.compile_timeout_s - (time.monotonic() - item.submitted)
    summary.evaluated += 1
    try:
        outcome: CompileOutcome = item.future.result(timeout=max(1.0, remaining))
    except cf.TimeoutError:
        summary.failed += 1
        return _finish(study, trial, storage_call, status="compile_timeout",
                       reason=f"compile took over {settings.compile_timeout_s:.0f} s")
    except cf.process.BrokenProcessPool as e:
        summary.failed += 1
        return _finish(study, trial, storage_call, status="compile_error", reason=f"compile process died: {e}")
    if outcome.status != "ok" or outcome.kernel is None:
        summary.failed += 1
        return _finish(study, trial, storage_call, status=outcome.status, reason=outcome.reason)
    kernel = outcome.kernel
    attrs = {
        st.RESOURCES: kernel.resources.to_dict(),
        st.COMPILE: {"seconds": round(kernel.seconds, 3), "cached": kernel.cached, "arch": kernel.arch},
    }
    job = measure_job_for(space, item.config, problem, device, kernel, settings.measure, tag=f"trial-{trial.number}")
    result = measure(job)
    attrs[st.MEASUREMENT] = {k: v for k, v in result.to_dict().items() if k not in ("status", "detail")}
    if not result.ok:
        summary.failed += 1
        return _finish(study, trial, storage_call, status=result.status, reason=result.detail, attrs=attrs)
    return _finish(study, trial, storage_call, status="ok", attrs=attrs, value=result.tflops)


def _finish(study: optuna.Study, trial: Trial, storage_call: Callable[..., Any], *, status: str, reason: str = "",
            attrs: dict[str, Any] | None = None, value: float | None = None,
            state: TrialState | None = None) -> FrozenTrial:
    """Store the trial's attributes and its outcome in one retried step.

    ``value`` given: COMPLETE; otherwise ``state`` (default PRUNED, which samplers treat as bad).
    """
    attrs = {st.CONFIG_KEY: config_key(trial.params), st.STATUS: status, **(attrs or {})}
    if reason:
        attrs[st.REASON] = reason[:1000]

    def store() -> FrozenTrial:
        try:
            for key, v in attrs.items():
                trial.set_user_attr(key, v)
            if value is not None:
                return study.tell(trial, value)
            return study.tell(trial, state=state or TrialState.PRUNED)
        except optuna.exceptions.UpdateFinishedTrialError:
            # an earlier attempt committed and lost its reply (the database went away), or
            # another tuner failed the trial as stale while this one could not beat: keep what is stored
            return study._storage.get_trial(trial._trial_id)

    return storage_call(store, what=f"storing trial {trial.number}")


def _finish_duplicate(study: optuna.Study, trial: Trial, original: FrozenTrial,
                      storage_call: Callable[..., Any]) -> FrozenTrial:
    """The sampler proposed a config already evaluated: give it the same outcome without measuring again."""
    attrs = {st.DUPLICATE_OF: original.number}
    status = original.user_attrs.get(st.STATUS, "ok")
    if original.state == TrialState.COMPLETE:
        return _finish(study, trial, storage_call, status=status, attrs=attrs, value=original.value)
    return _finish(study, trial, storage_call, status=status, reason=original.user_attrs.get(st.REASON, ""),
                   attrs=attrs)


def _others_may_finish(state: _StudyState, settings: TuneSettings, deadline: float | None, idle_asks: int) -> bool:
    """The budget is held by RUNNING trials of other processes (or of a dead one, until recovered)."""
    if settings.n_trials is None or state.evaluated >= settings.n_trials or idle_asks >= settings.max_idle_asks:
        return False
    return state.running > 0 and (deadline is None or time.monotonic() < deadline)


def _counts(t: FrozenTrial) -> bool:
    """Whether a trial counts against the budget: finished, past the static check, not a duplicate."""
    return (t.state in (TrialState.COMPLETE, TrialState.PRUNED) and t.user_attrs.get(st.STATUS) not in (None, "infeasible")
            and st.DUPLICATE_OF not in t.user_attrs)
