"""The tuning loop of one process: propose → compile ahead on CPU processes → measure on the GPU → store.

A :class:`~tuner.search.Search` proposes statically feasible configs nobody has taken (what it
draws that is infeasible or already evaluated is settled in memory, at no storage round trip);
each proposal becomes a stored trial, compiles in a process pool while the GPU measures earlier
ones, and is told to the study with its outcome. A config that fails to compile, computes a
wrong result, hangs or crashes is stored as PRUNED with its reason, so the search learns to
avoid it and the study goes on. Enqueued configs (the default, configs re-queued after a lost
worker or an interruption, a suite's warm start) are taken before new proposals.

Several processes (GPUs, hosts) may run the loop on one study: the budget, de-duplication and
stale-trial recovery read the shared storage, not local state.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import functools
import math
import multiprocessing as mp
import os
import queue
import random
import signal
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from . import study as st
from .compile import CompileOutcome, compile_outcome
from .devices import DeviceLimits
from .heartbeat import HEARTBEAT_INTERVAL_S, REQUEUE_COUNT, REQUEUE_REASON, REQUEUED_FROM, Heartbeat, recover_stale
from .jobs import MeasureJob, MeasureResult, MeasureSettings, measure_job_for
from .problem import Problem
from .search import OptunaSearch, Search, distributions
from .space import Config, Space, config_key
from .storage import retrying, set_trial_user_attrs
from .study import TrialStatus

__all__ = ["RunStats", "TuneLoop", "TuneSettings", "TuneSummary", "compile_pool", "default_compile_workers", "tune"]


def default_compile_workers() -> int:
    """Every core but one (the tuner and the GPU worker): one sm90 build is ~2.3 s of one core."""
    return max(1, (os.cpu_count() or 2) - 1)


@dataclass(frozen=True, kw_only=True)
class TuneSettings:
    n_trials: int | None = 50  # evaluated trials the study should hold in total (a resumed study counts its own)
    timeout_s: float | None = None  # wall-clock budget of this run
    compile_workers: int = field(default_factory=default_compile_workers)  # 0: compile in this process (replay)
    compile_ahead: int | None = None  # configs compiling or compiled, not yet measured; None: compile_workers + 2
    compile_timeout_s: float = 600.0
    trial_timeout_s: float = 120.0
    refresh_interval_s: float = 0.5  # re-read the shared study at most this often while configs are in flight
    storage_retries: int = 6  # attempts per storage operation ...
    storage_retry_delay_s: float = 1.0  # ... waiting this long after the first failure, doubling each time
    measure: MeasureSettings = field(default_factory=MeasureSettings)

    @property
    def window(self) -> int:
        """How many configs the loop keeps compiling ahead of the GPU: enough to keep every compile
        process busy, and one or two finished ones ready for the GPU."""
        return self.compile_ahead if self.compile_ahead is not None else self.compile_workers + 2


@dataclass
class TuneSummary:
    evaluated: int = 0  # configs that passed the static check and were compiled (and measured)
    infeasible: int = 0  # enqueued configs the static check refused (the search's own draws: stats)
    failed: int = 0
    duplicates: int = 0  # enqueued configs evaluated already (answered from storage)
    explorations: int = 0  # unseen configs drawn at random because the search had none to offer
    stopped_because: str = ""
    best_tflops: float | None = None
    stats: RunStats | None = None


@dataclass
class RunStats:
    """Where one process's wall time went, for the study's throughput figures."""

    started: str = ""  # ISO time
    wall_s: float = 0.0
    evaluated: int = 0
    measured: int = 0  # evaluated configs that reached the GPU (compiled)
    kernel_s: float = 0.0  # GPU time in the trial kernels (checks and timed launches)
    measure_s: float = 0.0  # wall time inside measurements (GPU worker round trips)
    compile_wait_s: float = 0.0  # time the GPU sat idle waiting for a compile to finish
    search_s: float = 0.0  # proposing configs (the sampler's model, static checks, repairs)
    storage_s: float = 0.0  # storage round trips the loop waited for (new trials, reads)
    store_s: float = 0.0  # storing measured trials, on the storing thread (beside the loop, not in its wall time)
    search_asks: int = 0
    search_infeasible: int = 0
    search_repeats: int = 0

    @property
    def configs_per_s(self) -> float:
        return self.evaluated / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def gpu_busy(self) -> float:
        """Share of the wall time the GPU spent in trial kernels."""
        return self.kernel_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def gpu_busy_measuring(self) -> float:
        """Share of the time inside measurements (worker round trips) the GPU spent in trial kernels."""
        return self.kernel_s / self.measure_s if self.measure_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "configs_per_s": round(self.configs_per_s, 3), "gpu_busy": round(self.gpu_busy, 3),
                "gpu_busy_measuring": round(self.gpu_busy_measuring, 3)}

    def line(self) -> str:
        other = self.wall_s - self.measure_s - self.compile_wait_s - self.search_s - self.storage_s
        return (f"{self.evaluated} configs in {self.wall_s:.0f} s = {self.configs_per_s:.2f}/s, GPU busy "
                f"{100 * self.gpu_busy:.0f}% ({100 * self.gpu_busy_measuring:.0f}% while measuring); "
                f"wall time: measuring {self.measure_s:.0f} s, waiting for compiles "
                f"{self.compile_wait_s:.0f} s, search {self.search_s:.0f} s, storage {self.storage_s:.0f} s, "
                f"other {max(0.0, other):.0f} s; storing results beside: {self.store_s:.0f} s")


@dataclass
class _Pending:
    trial: Trial
    config: Config
    future: cf.Future
    submitted: float


@dataclass
class _Held:
    """Every trial this process holds, in one place: an interruption fails them all and enqueues
    again each config that was drawn but not measured."""

    in_hand: Trial | None = None  # asked, its (enqueued) config not drawn yet
    compiling: list[_Pending] = field(default_factory=list)  # drawn; compiling or compiled, not yet measured
    duplicates: dict[str, list[Trial]] = field(default_factory=dict)  # enqueued again while their config compiles

    def keys(self) -> set[str]:
        return {config_key(p.config) for p in self.compiling}

    def for_cleanup(self) -> list[tuple[Trial, Config | None, bool]]:
        """(trial, config, enqueue again): config None with True means the trial's enqueued config."""
        held: list[tuple[Trial, Config | None, bool]] = [(p.trial, p.config, True) for p in self.compiling]
        held += [(t, None, False) for ts in self.duplicates.values() for t in ts]  # their config is compiling
        if self.in_hand is not None:  # an enqueued config (the default, say) is known before it is drawn
            held.append((self.in_hand, None, True))
        return held


class _StudyState:
    """What the loop knows of the shared study, updated from storage each round (only what changed)."""

    def __init__(self) -> None:
        self.seen: dict[str, FrozenTrial] = {}  # config key -> first finished trial of that config
        self.evaluated = 0
        self.running = 0
        self.waiting = 0  # enqueued trials not yet taken by any tuner
        self.running_elsewhere: set[str] = set()  # configs of RUNNING trials (of any tuner)
        self.best: float | None = None
        self._done: set[int] = set()  # numbers of finished trials already read

    def refresh(self, study: optuna.Study, search: Search) -> None:
        self.running, self.waiting, self.running_elsewhere = 0, 0, set()
        for t in study.get_trials(deepcopy=False):  # Optuna's cached storage re-reads only unfinished trials
            if t.state == TrialState.RUNNING:
                self.running += 1
                if t.params:
                    self.running_elsewhere.add(config_key(t.params))
            elif t.state == TrialState.WAITING:
                self.waiting += 1
            elif t.number not in self._done and t.state.is_finished():
                self.record(t, search)

    def record(self, t: FrozenTrial, search: Search) -> None:
        """Account for a finished trial (once): the budget, the configs taken, the best, the search."""
        if t.number in self._done:
            return
        self._done.add(t.number)
        if t.state not in (TrialState.COMPLETE, TrialState.PRUNED) or not t.params:
            return
        if st.is_evaluated(t):
            self.evaluated += 1
        if st.DUPLICATE_OF in t.user_attrs:
            return
        key = t.user_attrs.get(st.CONFIG_KEY) or config_key(t.params)
        self.seen.setdefault(key, t)
        if t.state == TrialState.COMPLETE and t.value is not None:
            self.best = t.value if self.best is None else max(self.best, t.value)
        with contextlib.suppress(Exception):  # a config that no longer fits the space teaches nothing
            search.observe(search.space.validate(t.params), t.value if t.state == TrialState.COMPLETE else None)


class TuneLoop:
    """One process's loop over a shared study. Each round: recover stale trials now and then, read
    the study, fill the compile queue (enqueued configs first, then the search's proposals, else a
    random unseen one), measure the config whose compile finished first, store it; stop when the
    budget is reached, time is up, or nothing is left to propose."""

    def __init__(self, study: optuna.Study, space: Space, problem: Problem, device: DeviceLimits,
                 measure: Callable[[MeasureJob], MeasureResult], settings: TuneSettings, *,
                 search: Search | None = None, compiler: Callable[..., CompileOutcome] = compile_outcome,
                 progress: Callable[[dict[str, Any]], None] | None = None, pool: cf.Executor | None = None) -> None:
        self.study, self.space, self.problem, self.device = study, space, problem, device
        self.measure, self.settings, self.compiler, self.progress = measure, settings, compiler, progress
        # by default the study's own sampler, run in memory (see tuner.search)
        self.search = search or OptunaSearch(space, problem, device, settings.measure.seed, study.sampler)
        self.dists = distributions(space)
        self.summary = TuneSummary()
        self.stats = RunStats(started=datetime.now().isoformat(timespec="seconds"))
        self.state = _StudyState()
        self.held = _Held()
        self.heartbeat = Heartbeat(study._storage)
        self.rng = random.Random(f"{settings.measure.seed}-{os.getpid()}")  # processes on one study explore apart
        self.storage_call = functools.partial(retrying, attempts=settings.storage_retries,
                                              first_delay_s=settings.storage_retry_delay_s)
        self.start = time.monotonic()
        self.deadline = self.start + settings.timeout_s if settings.timeout_s is not None else None
        self.storer = _Storer()
        self.own_pool = pool is None  # a pool given (a suite's, shared by its studies) stays open
        self.pool = pool if pool is not None else compile_pool(settings)
        self._last_recovery = 0.0
        self._last_refresh = -math.inf
        self._nothing_to_propose = False
        self._exploration_failed = False  # no unseen feasible config turned up: do not draw thousands again

    # -- the loop --------------------------------------------------------------------------
    def run(self) -> TuneSummary:
        with warnings.catch_warnings(), self.heartbeat:
            # the storage beats for ask/tell trials through `heartbeat`; Optuna's warning assumes optimize()
            warnings.filterwarnings("ignore", message=".*Heartbeat.*", category=UserWarning)
            try:
                while self._round():
                    pass
            finally:
                self._stop()
        self._timed_storage(lambda: self.state.refresh(self.study, self.search), "reading the study")
        self._finish_stats()
        self._report("done")
        return self.summary

    def _round(self) -> bool:
        """One round; False once the loop should stop (``summary.stopped_because`` says why)."""
        self.storer.check()
        self._recover_stale_if_due()
        self._refresh_if_due()
        self._fill_queue()
        if self.held.compiling:
            self._measure_next()
            return True
        if self._others_may_finish():
            time.sleep(1.0)  # trials held elsewhere: they finish (or go stale and return): look again soon
            return True
        self.summary.stopped_because = self._why_stopped()
        return False

    def _budget_left(self) -> bool:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return False
        n = self.settings.n_trials
        if n is None:
            return True
        if self._near_target():  # other tuners' trials decide now: read the study before each new trial
            self._timed_storage(lambda: self.state.refresh(self.study, self.search), "reading the study")
            self._last_refresh = time.monotonic()
        return self.state.evaluated + self.state.running < n

    def _near_target(self) -> bool:
        """Few trials left to the target (as last read): then the study is read each round and before each
        new trial, so that tuners sharing it pass the target by at most about one trial each."""
        n = self.settings.n_trials
        return n is not None and n - self.state.evaluated - self.state.running <= max(32, 4 * self.settings.window)

    def _why_stopped(self) -> str:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return "time budget used"
        if self._nothing_to_propose:
            return "no feasible config left to propose: space exhausted"
        return f"the study holds {self.state.evaluated} evaluated trials"

    def _others_may_finish(self) -> bool:
        """The budget is held by RUNNING trials of other processes (or of a dead one, until recovered)."""
        n = self.settings.n_trials
        if n is None or self.state.evaluated >= n or self.state.running == 0:
            return False
        return self.deadline is None or time.monotonic() < self.deadline

    def _refresh_if_due(self) -> None:
        """Re-read the study; while configs are in flight, at most every ``refresh_interval_s`` (this
        process's own trials are accounted for locally meanwhile)."""
        due = time.monotonic() - self._last_refresh >= self.settings.refresh_interval_s
        if due or not self.held.compiling or self._near_target():
            self._timed_storage(lambda: self.state.refresh(self.study, self.search), "reading the study")
            self._last_refresh = time.monotonic()

    def _recover_stale_if_due(self) -> None:
        if time.monotonic() - self._last_recovery > HEARTBEAT_INTERVAL_S:
            self._timed_storage(lambda: recover_stale(self.study, frozenset(self.dists)), "stale-trial recovery")
            self._last_recovery = time.monotonic()

    # -- fill the compile queue ------------------------------------------------------------------
    def _fill_queue(self) -> None:
        self._nothing_to_propose = False
        while len(self.held.compiling) < self.settings.window and self._budget_left():
            if not self._start_next():
                break

    def _start_next(self) -> bool:
        """Start one more trial: an enqueued config if any, else a proposal. False: nothing to start."""
        if self.state.waiting > 0:
            self.state.waiting -= 1
            trial_id = self._timed_storage(self.study._pop_waiting_trial_id, "taking an enqueued trial")
            if trial_id is not None:
                self._start_enqueued(Trial(self.study, trial_id))
                return True
        config, attrs = self._propose()
        if config is None:
            self._nothing_to_propose = True
            return False
        trial = self._timed_storage(lambda: self._create_trial(config, attrs), "storing a new trial")
        self.heartbeat.hold(trial)
        self._submit(trial, config)
        return True

    def _taken(self) -> set[str]:
        return self.state.seen.keys() | self.state.running_elsewhere | self.held.keys()

    def _propose(self) -> tuple[Config | None, dict[str, Any]]:
        """The search's next config; when it has none (it keeps repeating itself), a random unseen one."""
        t0 = time.monotonic()
        try:
            taken = self._taken()
            config = self.search.propose(taken)
            if config is not None:
                return config, {}
            if self.search.exhaustive or self._exploration_failed:  # nothing left that a random draw could find
                return None, {}
            config = _unseen_feasible(self.space, self.problem, self.device, taken, self.rng)
            if config is None:
                self._exploration_failed = True
                return None, {}
            self.summary.explorations += 1
            return config, {st.EXPLORATION: True}
        finally:
            self.stats.search_s += time.monotonic() - t0

    def _create_trial(self, config: Config, attrs: dict[str, Any]) -> Trial:
        """A RUNNING trial holding ``config``, created with its parameters in one storage round trip."""
        template = FrozenTrial(number=-1, state=TrialState.RUNNING, value=None, values=None,
                               datetime_start=datetime.now(), datetime_complete=None, params=dict(config),
                               distributions=self.dists, user_attrs=dict(attrs), system_attrs={},
                               intermediate_values={}, trial_id=-1)
        return Trial(self.study, self.study._storage.create_new_trial(self.study._study_id, template_trial=template))

    def _start_enqueued(self, trial: Trial) -> None:
        """Draw an enqueued trial's config; measure it, or settle it at once (evaluated already, infeasible)."""
        self.held.in_hand = trial
        self.heartbeat.hold(trial)
        try:
            config = self.space.validate(self._timed_storage(lambda: _draw(trial, self.dists), "drawing parameters"))
        except optuna.exceptions.UpdateFinishedTrialError:  # another tuner failed it as stale meanwhile
            self.held.in_hand = None
            self.heartbeat.release(trial)
            return
        key = config_key(config)
        if key in self.held.keys():
            self.held.duplicates.setdefault(key, []).append(trial)
            self.summary.duplicates += 1
            self.held.in_hand = None
            return
        if key in self.state.seen:
            _finish_duplicate(self.study, trial, self.state.seen[key], self.storage_call)
            self.summary.duplicates += 1
        elif (reason := self.space.check(config, self.problem, self.device)) is not None:
            self.state.seen[key] = _finish(self.study, trial, self.storage_call, status=TrialStatus.INFEASIBLE,
                                           reason=reason)
            self.summary.infeasible += 1
            self._report("infeasible")
        else:
            self._submit(trial, config)
            return
        self.held.in_hand = None
        self.heartbeat.release(trial)

    def _submit(self, trial: Trial, config: Config) -> None:
        try:
            future = self.pool.submit(self.compiler, str(self.space.path), config, self.problem, self.device)
        except cf.process.BrokenProcessPool:  # a compile process was killed (OOM, say): renew the pool
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = compile_pool(self.settings)
            self.own_pool = True
            future = self.pool.submit(self.compiler, str(self.space.path), config, self.problem, self.device)
        self.held.compiling.append(_Pending(trial, config, future, time.monotonic()))
        self.held.in_hand = None
        self.state.running += 1  # counts against the budget until the next read of the study

    # -- measure the next compiled config -----------------------------------------------------
    def _next_compiled(self) -> _Pending:
        """The config whose compile finished first (waiting for one, which the stats count as GPU idle),
        or one whose compile is overdue."""
        compiling = self.held.compiling
        done = [p for p in compiling if p.future.done()]
        if not done:
            t0 = time.monotonic()
            overdue_in = min(p.submitted + self.settings.compile_timeout_s for p in compiling) - t0
            cf.wait([p.future for p in compiling], timeout=max(0.0, overdue_in), return_when=cf.FIRST_COMPLETED)
            self.stats.compile_wait_s += time.monotonic() - t0
            done = [p for p in compiling if p.future.done()] or [min(compiling, key=lambda p: p.submitted)]
        return min(done, key=lambda p: p.submitted)

    def _measure_next(self) -> None:
        """Measure the next compiled config; its outcome counts at once, and is stored on the storing thread
        while the GPU measures the next one."""
        item = self._next_compiled()  # stays held until its outcome is queued, so that an interruption fails it
        outcome = self._run_one(item)
        self.held.compiling.remove(item)
        key = config_key(item.config)
        frozen = _finished(item.trial, item.config, self.dists, **outcome)
        if frozen.state != TrialState.COMPLETE:
            self.summary.failed += 1
        self.state.record(frozen, self.search)  # now: the study is re-read only every refresh_interval_s
        self.state.seen[key] = frozen
        self.state.running -= 1
        duplicates = self.held.duplicates.pop(key, [])
        self.storer.submit(functools.partial(self._store, item.trial, item.config, outcome, duplicates, frozen))
        self._report("trial")

    def _store(self, trial: Trial, config: Config, outcome: dict[str, Any], duplicates: list[Trial],
               frozen: FrozenTrial) -> None:
        """On the storing thread: the trial's outcome, then the enqueued duplicates of its config; each trial's
        heartbeat stops once it is stored."""
        t0 = time.monotonic()
        _finish(self.study, trial, self.storage_call, config=config, **outcome)
        self.heartbeat.release(trial)
        for duplicate in duplicates:
            _finish_duplicate(self.study, duplicate, frozen, self.storage_call)
            self.heartbeat.release(duplicate)
        self.stats.store_s += time.monotonic() - t0

    def _run_one(self, item: _Pending) -> dict[str, Any]:
        """Wait for the config's compile and measure it: the outcome as :func:`_finish` takes it."""
        trial, settings = item.trial, self.settings
        self.summary.evaluated += 1
        remaining = settings.compile_timeout_s - (time.monotonic() - item.submitted)
        try:
            outcome: CompileOutcome = item.future.result(timeout=max(0.0, remaining))
        except cf.TimeoutError:
            return {"status": TrialStatus.COMPILE_TIMEOUT,
                    "reason": f"compile took over {settings.compile_timeout_s:.0f} s"}
        except cf.process.BrokenProcessPool as e:
            return {"status": TrialStatus.COMPILE_ERROR, "reason": f"compile process died: {e}"}
        if outcome.status != "ok" or outcome.kernel is None:
            return {"status": outcome.status, "reason": outcome.reason}
        kernel = outcome.kernel
        attrs = {
            st.RESOURCES: kernel.resources.to_dict(),
            st.COMPILE: {"seconds": round(kernel.seconds, 3), "cached": kernel.cached, "arch": kernel.arch},
        }
        job = measure_job_for(self.space, item.config, self.problem, self.device, kernel, settings.measure,
                              tag=f"trial-{trial.number}")
        t0 = time.monotonic()
        result = self.measure(job)
        self.stats.measure_s += time.monotonic() - t0
        self.stats.measured += 1
        self.stats.kernel_s += _kernel_seconds(result)
        attrs[st.MEASUREMENT] = {k: v for k, v in result.to_dict().items() if k not in ("status", "detail")}
        if not result.ok:
            return {"status": result.status, "reason": result.detail, "attrs": attrs}
        return {"status": TrialStatus.OK, "attrs": attrs, "value": result.tflops}

    # -- bookkeeping ------------------------------------------------------------------------------
    def _timed_storage(self, call: Callable[[], Any], what: str) -> Any:
        t0 = time.monotonic()
        try:
            return self.storage_call(call, what=what)
        finally:
            self.stats.storage_s += time.monotonic() - t0

    def _finish_stats(self) -> None:
        s = self.stats
        s.wall_s = time.monotonic() - self.start
        s.evaluated = self.summary.evaluated
        s.search_asks, s.search_infeasible, s.search_repeats = (self.search.stats.asks, self.search.stats.infeasible,
                                                                self.search.stats.repeats)
        self.summary.stats = s
        self.summary.best_tflops = self.state.best
        if s.evaluated:  # the study keeps every run's figures (the report shows them)
            run_id = f"{socket.gethostname()}:{os.getpid()}:{s.started}"
            with contextlib.suppress(Exception):  # figures are nice to have; never fail a finished run for them
                self.storage_call(lambda: self.study.set_user_attr(f"{st.THROUGHPUT_PREFIX}{run_id}", s.to_dict()),
                                  what="storing the run's throughput")

    def _report(self, event: str) -> None:
        self.summary.best_tflops = self.state.best
        if self.progress:
            wall = time.monotonic() - self.start
            self.progress({"event": event, "evaluated": self.state.evaluated, "target": self.settings.n_trials,
                           "best_tflops": self.state.best, "compiling": len(self.held.compiling),
                           "infeasible": self.summary.infeasible + self.search.stats.infeasible,
                           "failed": self.summary.failed,
                           "configs_per_s": self.summary.evaluated / wall if wall > 0 else 0.0,
                           "gpu_busy": self.stats.kernel_s / wall if wall > 0 else 0.0,
                           "compile_wait_s": self.stats.compile_wait_s})

    # -- stop --------------------------------------------------------------------------------------
    def _stop(self) -> None:
        """Store what was measured, fail what this process still holds (re-enqueueing drawn configs) and
        shut the compile pool."""
        for item in self.held.compiling:
            item.future.cancel()
        cleanup_call = functools.partial(retrying, attempts=3, first_delay_s=self.settings.storage_retry_delay_s)
        with _ctrl_c_deferred():
            error = self.storer.close()
            _stop_cleanly(self.study, self.held.for_cleanup(), cleanup_call)
        if error is not None and sys.exc_info()[0] is None:
            raise error
        for proposal in self.held.compiling:
            self.search.withdraw(proposal.config)
        if self.own_pool:
            self.pool.shutdown(wait=False, cancel_futures=True)


def tune(study: optuna.Study, space: Space, problem: Problem, device: DeviceLimits,
         measure: Callable[[MeasureJob], MeasureResult], settings: TuneSettings, *,
         search: Search | None = None, compiler: Callable[..., CompileOutcome] = compile_outcome,
         progress: Callable[[dict[str, Any]], None] | None = None, pool: cf.Executor | None = None) -> TuneSummary:
    """Run trials until the study holds ``settings.n_trials`` evaluated trials, time is up, or the space is
    exhausted (see :class:`TuneLoop`). ``search`` defaults to the study's own sampler, run in memory; ``pool``
    to a compile pool of the loop's own."""
    return TuneLoop(study, space, problem, device, measure, settings, search=search, compiler=compiler,
                    progress=progress, pool=pool).run()


# -- storing outcomes ----------------------------------------------------------------------------
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
            frozen = _finish(study, trial, storage_call, status=TrialStatus.INTERRUPTED, reason="the tuner stopped",
                             state=TrialState.FAIL)
            if requeue and config is not None and TrialStatus.of(frozen) is TrialStatus.INTERRUPTED:
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


def _outcome_attrs(config: Config, status: str, reason: str, attrs: dict[str, Any] | None) -> dict[str, Any]:
    out = {st.CONFIG_KEY: config_key(config), st.STATUS: status, **(attrs or {})}
    if reason:
        out[st.REASON] = reason[:1000]
    return out


def _finished(trial: Trial, config: Config, dists: dict[str, Any], *, status: str, reason: str = "",
              attrs: dict[str, Any] | None = None, value: float | None = None) -> FrozenTrial:
    """The trial as it will be stored: what the loop counts while the storing thread writes it."""
    return FrozenTrial(number=trial.number, state=TrialState.COMPLETE if value is not None else TrialState.PRUNED,
                       value=value, values=None, datetime_start=None, datetime_complete=datetime.now(),
                       params=dict(config), distributions=dists, user_attrs=_outcome_attrs(config, status, reason,
                                                                                            attrs),
                       system_attrs={}, intermediate_values={}, trial_id=trial._trial_id)


def _finish(study: optuna.Study, trial: Trial, storage_call: Callable[..., Any], *, status: str, reason: str = "",
            attrs: dict[str, Any] | None = None, value: float | None = None,
            state: TrialState | None = None, config: Config | None = None) -> FrozenTrial:
    """Store the trial's attributes and its outcome in one retried step.

    ``value`` given: COMPLETE; otherwise ``state`` (default PRUNED, which samplers treat as bad).
    """
    attrs = _outcome_attrs(config if config is not None else trial.params, status, reason, attrs)

    def store() -> FrozenTrial:
        try:
            set_trial_user_attrs(study._storage, trial._trial_id, attrs)
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
    """An enqueued config was evaluated already: give it the same outcome without measuring again."""
    attrs = {st.DUPLICATE_OF: original.number}
    status = original.user_attrs.get(st.STATUS, TrialStatus.OK)
    if original.state == TrialState.COMPLETE:
        return _finish(study, trial, storage_call, status=status, attrs=attrs, value=original.value)
    return _finish(study, trial, storage_call, status=status, reason=original.user_attrs.get(st.REASON, ""),
                   attrs=attrs)


# -- helpers ---------------------------------------------------------------------------------------
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
    """Read back (suggest) every knob of an enqueued trial; repeating it is harmless."""
    return {name: trial.suggest_categorical(name, dist.choices) for name, dist in dists.items()}


class _Storer:
    """One thread that runs storage jobs in order, so that storing a measured trial does not hold up the
    GPU. A job that fails (the database is gone past its retries) stops the rest; :meth:`check` and
    :meth:`close` hand its error to the loop."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[Callable[[], Any] | None] = queue.Queue()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="flashtune-store", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            if self.error is None:
                try:
                    job()
                except BaseException as e:  # noqa: BLE001 - handed to the loop's thread
                    self.error = e

    def submit(self, job: Callable[[], Any]) -> None:
        self.check()
        self._jobs.put(job)

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def close(self) -> BaseException | None:
        """Run the jobs queued so far, end the thread; the first job's error, if any."""
        self._jobs.put(None)
        self._thread.join()
        return self.error


class _InlineExecutor(cf.Executor):
    """Compiles in the calling process (``compile_workers = 0``: replay, where compiling is a lookup)."""

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
        future: cf.Future = cf.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as e:  # noqa: BLE001 - delivered through the future, as a pool would
            future.set_exception(e)
        return future


def compile_pool(settings: TuneSettings) -> cf.Executor:
    """``settings.compile_workers`` spawned processes (0: compile in this process)."""
    if settings.compile_workers == 0:
        return _InlineExecutor()
    return cf.ProcessPoolExecutor(max_workers=settings.compile_workers, mp_context=mp.get_context("spawn"))


def _kernel_seconds(result: MeasureResult) -> float:
    """GPU time a measurement spent in the kernel: what the worker reports, else latency x repetitions."""
    if result.kernel_ms is not None:
        return result.kernel_ms / 1e3
    return (result.latency_ms or 0.0) * (result.reps or 0) / 1e3
