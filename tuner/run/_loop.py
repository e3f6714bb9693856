"""The tuning loop of one process: propose → compile ahead on CPU processes → measure on the GPUs → store.

A :class:`~tuner.search.Search` proposes statically feasible configs nobody has taken (what it
draws that is infeasible or already evaluated is settled in memory, at no storage round trip);
each proposal becomes a stored trial, compiles in a process pool while the GPUs measure earlier
ones, and is told to the study with its outcome. A config that fails to compile, computes a
wrong result, hangs or crashes is stored as PRUNED with its reason, so the search learns to
avoid it and the study goes on. Enqueued configs (the default, configs re-queued after a lost
worker or an interruption, a suite's warm start) are taken before new proposals.

The loop's thread proposes, creates, reads and (through a storing thread) stores trials while
each GPU measures on a lane of its own (:mod:`._threads`): one process drives every
GPU of its host. Several processes (hosts) may run the loop on one study: the budget,
de-duplication and stale-trial recovery read the shared storage, not local state.

What becomes of each config is one :class:`~tuner.outcome.Outcome` from its compile (payload: the
kernel) through its measurement job and its measurement to the stored trial. The loop calls its
compiler and its GPUs through the :class:`~._contracts.Compile` and :class:`~._contracts.Measure`
contracts, and every random choice it makes follows its seed.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import functools
import math
import os
import random
import signal
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import optuna
from optuna.distributions import IntDistribution
from optuna.trial import FrozenTrial, Trial, TrialState

from .. import study as st
from ..compile import CompiledKernel, compile_outcome
from ..devices import DeviceLimits
from ..gpu import MeasureJob, MeasureResult, MeasureSettings, measure_job_for
from ..outcome import Outcome, Status
from ..problem import Problem
from ..progress import log
from ..search import Search
from ..space import Config, Space, config_key
from ..study import (
    HEARTBEAT_INTERVAL_S,
    OWNER,
    Heartbeat,
    TrialRef,
    create_running_trial,
    finish,
    finish_duplicate,
    finished,
    reading,
    recover_stale,
    retrying,
    stop_cleanly,
    this_process,
)
from ._contracts import Compile, Measure
from ._threads import GpuLane, Storer, close_pool, compile_pool

__all__ = ["RunStats", "TuneLoop", "TuneSettings", "TuneSummary", "default_compile_workers", "tune"]


def default_compile_workers() -> int:
    """Every core but one (the tuner and the GPU workers): one sm90 build is ~2.3 s of one core."""
    return max(1, (os.cpu_count() or 2) - 1)


@dataclass(frozen=True, kw_only=True)
class TuneSettings:
    n_trials: int | None = 50  # evaluated trials the study should hold in total (a resumed study counts its own)
    timeout_s: float | None = None  # wall-clock budget of this run
    # 0: compile, and measure, in the loop's own thread, in order (replay, tests: a seeded run repeats)
    compile_workers: int = field(default_factory=default_compile_workers)
    compile_ahead: int | None = None  # configs compiling or compiled, not yet measuring; None: see window
    compile_timeout_s: float = 600.0
    trial_timeout_s: float = 120.0
    refresh_interval_s: float = 0.5  # re-read the shared study at most this often while configs are in flight
    storage_retries: int = 6  # attempts per storage operation ...
    storage_retry_delay_s: float = 1.0  # ... waiting this long after the first failure, doubling each time
    measure: MeasureSettings = field(default_factory=MeasureSettings)

    def window(self, gpus: int = 1) -> int:
        """How many configs the loop keeps compiling ahead of the GPUs: enough to keep every compile
        process busy, and two finished ones ready for each GPU."""
        return self.compile_ahead if self.compile_ahead is not None else self.compile_workers + 2 * gpus


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
    """Where one process's time went, for the study's throughput figures. GPU times are summed over its GPUs."""

    started: str = ""  # ISO time
    gpus: int = 1
    wall_s: float = 0.0
    evaluated: int = 0
    measured: int = 0  # evaluated configs that reached a GPU (compiled)
    measured_per_gpu: list[int] = field(default_factory=list)
    kernel_s: float = 0.0  # GPU time in the trial kernels (checks and timed launches)
    measure_s: float = 0.0  # GPU lanes' time inside measurements (GPU worker round trips)
    prepare_s: float = 0.0  # GPU lanes' time preparing (inputs, reference, warm-up), beside the first compiles
    compile_wait_s: float = 0.0  # GPU lanes' time idle while no compiled config was ready for them
    search_s: float = 0.0  # the loop proposing configs (the sampler's model, static checks, repairs)
    storage_s: float = 0.0  # the loop waiting for storage round trips (new trials, reads)
    store_s: float = 0.0  # storing measured trials, on the storing thread (beside the loop)
    search_asks: int = 0
    search_infeasible: int = 0
    search_repeats: int = 0

    @property
    def configs_per_s(self) -> float:
        return self.evaluated / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def gpu_busy(self) -> float:
        """Share of the GPUs' wall time spent in trial kernels."""
        return self.kernel_s / (self.wall_s * self.gpus) if self.wall_s > 0 else 0.0

    @property
    def gpu_busy_measuring(self) -> float:
        """Share of the time inside measurements (worker round trips) the GPUs spent in trial kernels."""
        return self.kernel_s / self.measure_s if self.measure_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "configs_per_s": round(self.configs_per_s, 3),
            "gpu_busy": round(self.gpu_busy, 3),
            "gpu_busy_measuring": round(self.gpu_busy_measuring, 3),
        }

    def line(self) -> str:
        per_gpu = 1 / max(1, self.gpus)
        return (
            f"{self.evaluated} configs in {self.wall_s:.0f} s = {self.configs_per_s:.2f}/s on {self.gpus} "
            f"GPU{'s' if self.gpus > 1 else ''}, GPU busy {100 * self.gpu_busy:.0f}% "
            f"({100 * self.gpu_busy_measuring:.0f}% while measuring); per GPU: measuring "
            f"{self.measure_s * per_gpu:.0f} s, waiting for compiles {self.compile_wait_s * per_gpu:.0f} s "
            f"(preparing {self.prepare_s * per_gpu:.0f} s); "
            f"the loop: search {self.search_s:.0f} s, storage {self.storage_s:.0f} s; storing results "
            f"beside: {self.store_s:.0f} s"
        )


@dataclass
class _Pending:
    """A drawn config: compiling or compiled (``job`` set once its compile is read), then measuring on ``lane``."""

    trial: TrialRef
    config: Config
    future: cf.Future  # the compile's, then the measurement's
    submitted: float
    attrs: dict[str, Any] = field(default_factory=dict)
    lane: GpuLane | None = None


@dataclass
class _Held:
    """Every trial this process holds, in one place: an interruption fails them all and enqueues
    again each config that was drawn but not measured."""

    in_hand: TrialRef | None = None  # asked, its (enqueued) config not drawn yet
    compiling: list[_Pending] = field(default_factory=list)  # drawn; compiling or compiled, not yet measuring
    measuring: list[_Pending] = field(default_factory=list)  # on a GPU lane
    duplicates: dict[str, list[TrialRef]] = field(default_factory=dict)  # enqueued again while their config runs

    def in_flight(self) -> int:
        return len(self.compiling) + len(self.measuring)

    def keys(self) -> set[str]:
        return {config_key(p.config) for p in (*self.compiling, *self.measuring)}

    def __contains__(self, key: str) -> bool:
        return key in self.keys()

    def for_cleanup(self) -> list[tuple[TrialRef, Config | None, bool]]:
        """(trial, config, enqueue again): config None with True means the trial's enqueued config."""
        held: list[tuple[TrialRef, Config | None, bool]] = [
            (p.trial, p.config, True) for p in (*self.measuring, *self.compiling)
        ]
        held += [(t, None, False) for ts in self.duplicates.values() for t in ts]  # their config is in flight
        if self.in_hand is not None:  # an enqueued config (the default, say) is known before it is drawn
            held.append((self.in_hand, None, True))
        return held


class _StudyState:
    """What the loop knows of the shared study, updated from storage each round (only what changed).
    ``mine`` holds the ids of every trial this process took: while its storing thread writes them
    they are still RUNNING in storage, and counted here already."""

    def __init__(self) -> None:
        self.seen: dict[str, FrozenTrial] = {}  # config key -> first finished trial of that config
        self.evaluated = 0
        self.running_elsewhere = 0  # RUNNING trials of other tuners (or of a dead one, until recovered)
        self.waiting = 0  # enqueued trials not yet taken by any tuner
        self.keys_elsewhere: set[str] = set()  # configs of other tuners' RUNNING trials
        self.others_seen = False  # another tuner has run or finished a trial of this study since this one started
        self.best: float | None = None
        self.mine: set[int] = set()
        self._done: set[int] = set()  # numbers of finished trials already read
        self._reads = 0

    def refresh(self, study: optuna.Study, search: Search) -> None:
        self.running_elsewhere, self.waiting, self.keys_elsewhere = 0, 0, set()
        with reading():  # Optuna's cached storage re-reads only unfinished and new trials
            trials = study.get_trials(deepcopy=False)
        first_read, self._reads = self._reads == 0, self._reads + 1
        for t in trials:
            if t.state == TrialState.RUNNING:
                if st.trial_id_of(t) not in self.mine:
                    self.running_elsewhere += 1
                    self.others_seen = True
                    if t.params:
                        self.keys_elsewhere.add(config_key(t.params))
            elif t.state == TrialState.WAITING:
                self.waiting += 1
            elif t.number not in self._done and t.state.is_finished():
                self.others_seen |= not first_read and st.trial_id_of(t) not in self.mine
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
            if st.WARM_START in t.user_attrs:  # a warm start stored before this process (a resumed study)
                search.add_start(search.space.validate(t.params))
            search.observe(search.space.validate(t.params), t.value if t.state == TrialState.COMPLETE else None)


class TuneLoop:
    """One process's loop over a shared study. Each round: recover stale trials now and then, read the
    study, settle the measurements that finished, fill the compile queue (enqueued configs first, then
    the search's proposals, else a random unseen one), hand compiled configs to idle GPUs, and wait for
    the next compile or measurement to finish; stop when the budget is reached, time is up, or nothing
    is left to propose. ``measure``: one :class:`Measure` per GPU (or one: one GPU), each prepared first,
    while the first configs compile. ``search`` proposes the configs (the caller's: :func:`tuner.search.make_search`).
    ``seed``: the loop's own random draws (exploration), default ``settings.measure.seed``; the same seeds
    (this and the search's) give the same run."""

    def __init__(
        self,
        study: optuna.Study,
        space: Space,
        problem: Problem,
        device: DeviceLimits,
        measure: Measure | Sequence[Measure],
        settings: TuneSettings,
        *,
        search: Search,
        compiler: Compile = compile_outcome,
        progress: Callable[[dict[str, Any]], None] | None = None,
        pool: cf.Executor | None = None,
        seed: int | None = None,
    ) -> None:
        self.study, self.space, self.problem, self.device = study, space, problem, device
        self.settings, self.compiler, self.progress = settings, compiler, progress
        measures = [measure] if isinstance(measure, Measure) else list(measure)
        if not measures:
            raise ValueError("the tuning loop needs a GPU to measure on")
        inline = settings.compile_workers == 0
        self.lanes = [
            GpuLane(m, index=i, inline=inline, problem=problem, settings=settings.measure)
            for i, m in enumerate(measures)
        ]
        self.window = settings.window(len(self.lanes))
        self.search = search
        self.dists = st.knob_distributions(space, study.user_attrs)  # as this study stores them
        self.summary = TuneSummary()
        self.stats = RunStats(
            started=datetime.now().isoformat(timespec="seconds"),
            gpus=len(self.lanes),
            measured_per_gpu=[0] * len(self.lanes),
        )
        self.state = _StudyState()
        self.held = _Held()
        self.heartbeat = Heartbeat(st.study_storage(study))
        # processes on one study explore apart through their seeds (tuner.run: salted per host and GPU)
        self.rng = random.Random(f"explore-{settings.measure.seed if seed is None else seed}")
        self.storage_call = functools.partial(
            retrying, attempts=settings.storage_retries, first_delay_s=settings.storage_retry_delay_s
        )
        self.start = time.monotonic()
        self.deadline = self.start + settings.timeout_s if settings.timeout_s is not None else None
        self.storer = Storer()
        self.own_pool = pool is None  # a pool given (a suite's, shared by its studies) stays open
        self.pool = pool if pool is not None else compile_pool(settings.compile_workers)
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
        self._settle_measured()
        started = self._fill_queue()
        settled = self._start_measuring()
        if self.held.in_flight():
            self._wait()
            return True
        if started or settled:  # trials settled at once (evaluated already, infeasible, not compiled): go on
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
        if self._near_target() and self.state.others_seen:  # other tuners' trials decide: read before each new one
            self._timed_storage(lambda: self.state.refresh(self.study, self.search), "reading the study")
            self._last_refresh = time.monotonic()
        return self._counted() < n

    def _counted(self) -> int:
        """Trials that count against the budget: evaluated, and running here or elsewhere."""
        return self.state.evaluated + self.state.running_elsewhere + self.held.in_flight()

    def _near_target(self) -> bool:
        """Few trials left to the target (as last read): then, once other tuners share the study, it is read
        each round and before each new trial, so that they pass the target by at most about one trial each."""
        n = self.settings.n_trials
        return n is not None and n - self._counted() <= max(32, 4 * self.window)

    def _why_stopped(self) -> str:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return "time budget used"
        if self._nothing_to_propose:
            return "no feasible config left to propose: space exhausted"
        return f"the study holds {self.state.evaluated} evaluated trials"

    def _others_may_finish(self) -> bool:
        """The budget is held by RUNNING trials of other processes (or of a dead one, until recovered)."""
        n = self.settings.n_trials
        if n is None or self.state.evaluated >= n or self.state.running_elsewhere == 0:
            return False
        return self.deadline is None or time.monotonic() < self.deadline

    def _refresh_if_due(self) -> None:
        """Re-read the study; while configs are in flight, at most every ``refresh_interval_s`` (this
        process's own trials are accounted for locally meanwhile)."""
        due = time.monotonic() - self._last_refresh >= self.settings.refresh_interval_s
        if due or not self.held.in_flight() or (self._near_target() and self.state.others_seen):
            self._timed_storage(lambda: self.state.refresh(self.study, self.search), "reading the study")
            self._last_refresh = time.monotonic()

    def _recover_stale_if_due(self) -> None:
        if time.monotonic() - self._last_recovery > HEARTBEAT_INTERVAL_S:
            self._timed_storage(lambda: recover_stale(self.study, frozenset(self.dists)), "stale-trial recovery")
            self._last_recovery = time.monotonic()

    # -- fill the compile queue ------------------------------------------------------------------
    def _fill_queue(self) -> int:
        """Start trials until the compile queue is full; how many were started."""
        self._nothing_to_propose = False
        started = 0
        while len(self.held.compiling) < self.window and self._budget_left():
            if not self._start_next():
                break
            started += 1
        return started

    def _start_next(self) -> bool:
        """Start one more trial: an enqueued config if any, else a proposal. False: nothing to start."""
        if self.state.waiting > 0:
            self.state.waiting -= 1
            trial_id = self._timed_storage(self.study._pop_waiting_trial_id, "taking an enqueued trial")
            if trial_id is not None:
                self._start_enqueued(trial_id)
                return True
        config, attrs = self._propose()
        if config is None:
            self._nothing_to_propose = True
            return False
        owner = {OWNER: this_process()} if self.heartbeat.enabled else {}
        trial = self._timed_storage(
            lambda: create_running_trial(self.study, config, self.dists, user_attrs=attrs, system_attrs=owner),
            "storing a new trial",
        )
        self.state.mine.add(trial.trial_id)
        self.heartbeat.hold(trial.trial_id, recorded=True)
        self._submit(trial, config)
        return True

    def _taken(self) -> set[str]:
        return self.state.seen.keys() | self.state.keys_elsewhere | self.held.keys()

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

    def _start_enqueued(self, trial_id: int) -> None:
        """Draw an enqueued trial's config; measure it, or settle it at once (evaluated already, infeasible)."""
        self.state.mine.add(trial_id)
        trial = self._timed_storage(lambda: Trial(self.study, trial_id), "reading an enqueued trial")
        ref = TrialRef.of(trial)
        self.held.in_hand = ref
        self.heartbeat.hold(trial_id)
        try:
            config = self.space.validate(self._timed_storage(lambda: _draw(trial, self.dists), "drawing parameters"))
        except optuna.exceptions.UpdateFinishedTrialError:  # another tuner failed it as stale meanwhile
            self.held.in_hand = None
            self.heartbeat.release(trial_id)
            return
        if st.WARM_START in trial.user_attrs:  # a neighbouring shape's winner: the search restarts from it too
            self.search.add_start(config)
        key = config_key(config)
        if key in self.held:
            self.held.duplicates.setdefault(key, []).append(ref)
            self.summary.duplicates += 1
            self.held.in_hand = None
            return
        if key in self.state.seen:
            finish_duplicate(self.study, ref, self.state.seen[key], self.storage_call, self.dists)
            self.summary.duplicates += 1
        elif (reason := self.space.check(config, self.problem, self.device)) is not None:
            self.state.seen[key] = finish(
                self.study,
                ref,
                self.storage_call,
                config=config,
                dists=self.dists,
                status=Status.INFEASIBLE,
                reason=reason,
            )
            self.summary.infeasible += 1
            self._report("infeasible")
        else:
            self._submit(ref, config)
            return
        self.held.in_hand = None
        self.heartbeat.release(trial_id)

    def _submit(self, trial: TrialRef, config: Config) -> None:
        try:
            future = self.pool.submit(self.compiler, str(self.space.path), config, self.problem, self.device)
        except cf.process.BrokenProcessPool:  # a compile process was killed (OOM, say): renew the pool
            close_pool(self.pool)
            self.pool = compile_pool(self.settings.compile_workers)
            self.own_pool = True
            future = self.pool.submit(self.compiler, str(self.space.path), config, self.problem, self.device)
        self.held.compiling.append(_Pending(trial, config, future, time.monotonic()))
        self.held.in_hand = None

    # -- hand compiled configs to idle GPUs ---------------------------------------------------
    def _next_compiled(self) -> _Pending | None:
        """The earliest drawn config whose compile finished (or is overdue), if any."""
        now = time.monotonic()
        ready = [
            p for p in self.held.compiling if p.future.done() or now - p.submitted >= self.settings.compile_timeout_s
        ]
        return min(ready, key=lambda p: p.submitted) if ready else None

    def _start_measuring(self) -> int:
        """Give each idle GPU the next compiled config; a config that did not compile is settled at once
        (how many were)."""
        idle = [lane for lane in self.lanes if not lane.busy]
        settled = 0
        while idle and (item := self._next_compiled()) is not None:
            job = self._job_for(item)
            if not job.ok or job.payload is None:  # the compile failed or is overdue: nothing to measure
                self.held.compiling.remove(item)
                self._settle(item, job)
                settled += 1
                continue
            item.lane = idle.pop(0)
            item.future = item.lane.start(job.payload)
            self.held.measuring.append(item)
            self.held.compiling.remove(item)
        return settled

    def _job_for(self, item: _Pending) -> Outcome[MeasureJob]:
        """A compiled config's outcome: ok with its measurement job (and its compile figures as attributes),
        or why there is none (the compile failed, its process died, or it is overdue)."""
        if not item.future.done():
            return Outcome(
                status=Status.COMPILE_TIMEOUT, reason=f"compile took over {self.settings.compile_timeout_s:.0f} s"
            )
        try:
            compiled: Outcome[CompiledKernel] = item.future.result()
        except cf.process.BrokenProcessPool as e:
            return Outcome(status=Status.COMPILE_ERROR, reason=f"compile process died: {e}")
        kernel = compiled.payload
        if not compiled.ok or kernel is None:
            return Outcome(status=compiled.status, reason=compiled.reason)
        item.attrs = {
            st.RESOURCES: kernel.resources.to_dict(),
            st.COMPILE: {"seconds": round(kernel.seconds, 3), "cached": kernel.cached, "arch": kernel.arch},
        }
        job = measure_job_for(
            self.space,
            item.config,
            self.problem,
            self.device,
            kernel,
            self.settings.measure,
            tag=f"trial-{item.trial.number}",
        )
        return Outcome(status=Status.OK, payload=job, attrs=item.attrs)

    def _wait(self) -> None:
        """Until a measurement finishes, or, while a GPU is idle, a compile (or a compile falls overdue).
        Time a GPU spends idle here with configs compiling counts as waiting for compiles."""
        idle = sum(not lane.busy for lane in self.lanes)
        futures = [p.future for p in self.held.measuring]
        timeout = None
        if idle and self.held.compiling:
            futures += [p.future for p in self.held.compiling]
            first_overdue = min(p.submitted for p in self.held.compiling) + self.settings.compile_timeout_s
            timeout = max(0.0, first_overdue - time.monotonic())
        t0 = time.monotonic()
        cf.wait(futures, timeout=timeout, return_when=cf.FIRST_COMPLETED)
        if idle and self.held.compiling:
            self.stats.compile_wait_s += idle * (time.monotonic() - t0)

    # -- settle finished measurements ---------------------------------------------------------
    def _settle_measured(self) -> None:
        """Count each finished measurement's outcome at once; it is stored on the storing thread while the
        GPUs go on. A GPU worker that cannot be restarted raises here (its trial stays held: it is
        enqueued again when the loop stops)."""
        for item in [p for p in self.held.measuring if p.future.done()]:
            result, seconds = item.future.result()
            assert item.lane is not None
            item.lane.busy = False
            self.stats.measure_s += seconds
            self.stats.measured += 1
            self.stats.measured_per_gpu[item.lane.index] += 1
            self.stats.kernel_s += _kernel_seconds(result)
            self.held.measuring.remove(item)
            self._settle(item, _measured(result, item.attrs))

    def _settle(self, item: _Pending, outcome: Outcome[Any]) -> None:
        """Count an evaluated config's outcome now (the study is re-read only every refresh_interval_s) and
        queue it for storing, with the enqueued duplicates of its config."""
        self.summary.evaluated += 1
        key = config_key(item.config)
        frozen = finished(item.trial, item.config, self.dists, **outcome.stored())
        if frozen.state != TrialState.COMPLETE:
            self.summary.failed += 1
        self.state.record(frozen, self.search)
        self.state.seen[key] = frozen
        log.debug(
            "trial %d: %s%s  %s",
            item.trial.number,
            frozen.user_attrs.get(st.STATUS, frozen.state.name.lower()),
            f" {frozen.value:.1f} TFLOPS" if frozen.value is not None else "",
            key,
        )
        duplicates = self.held.duplicates.pop(key, [])
        self.storer.submit(functools.partial(self._store, item.trial, item.config, outcome, duplicates, frozen))
        self._report("trial")

    def _store(
        self, trial: TrialRef, config: Config, outcome: Outcome[Any], duplicates: list[TrialRef], frozen: FrozenTrial
    ) -> None:
        """On the storing thread: the trial's outcome, then the enqueued duplicates of its config; each trial's
        heartbeat stops once it is stored."""
        t0 = time.monotonic()
        finish(self.study, trial, self.storage_call, config=config, dists=self.dists, **outcome.stored())
        self.heartbeat.release(trial.trial_id)
        for duplicate in duplicates:
            finish_duplicate(self.study, duplicate, frozen, self.storage_call, self.dists)
            self.heartbeat.release(duplicate.trial_id)
        self.stats.store_s += time.monotonic() - t0

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
        s.prepare_s = sum(
            lane.prepared.result() for lane in self.lanes if lane.prepared.done() and lane.prepared.exception() is None
        )
        s.search_asks, s.search_infeasible, s.search_repeats = (
            self.search.stats.asks,
            self.search.stats.infeasible,
            self.search.stats.repeats,
        )
        self.summary.stats = s
        self.summary.best_tflops = self.state.best
        if s.evaluated:  # the study keeps every run's figures (the report shows them)
            run_id = f"{socket.gethostname()}:{os.getpid()}:{s.started}"
            with contextlib.suppress(Exception):  # figures are nice to have; never fail a finished run for them
                self.storage_call(
                    lambda: self.study.set_user_attr(f"{st.THROUGHPUT_PREFIX}{run_id}", s.to_dict()),
                    what="storing the run's throughput",
                )

    def _report(self, event: str) -> None:
        self.summary.best_tflops = self.state.best
        if self.progress:
            wall = time.monotonic() - self.start
            self.progress(
                {
                    "event": event,
                    "evaluated": self.state.evaluated,
                    "target": self.settings.n_trials,
                    "best_tflops": self.state.best,
                    "compiling": len(self.held.compiling),
                    "infeasible": self.summary.infeasible + self.search.stats.infeasible,
                    "failed": self.summary.failed,
                    "configs_per_s": self.summary.evaluated / wall if wall > 0 else 0.0,
                    "gpu_busy": self.stats.kernel_s / (wall * len(self.lanes)) if wall > 0 else 0.0,
                    "compile_wait_s": self.stats.compile_wait_s,
                }
            )

    # -- stop --------------------------------------------------------------------------------------
    def _stop(self) -> None:
        """Store what was measured, fail what this process still holds (re-enqueueing drawn configs), and
        let go of the GPU lanes and the compile pool."""
        for item in self.held.compiling:
            item.future.cancel()
        cleanup_call = functools.partial(retrying, attempts=3, first_delay_s=self.settings.storage_retry_delay_s)
        with _ctrl_c_deferred():
            error = self.storer.close()
            stop_cleanly(self.study, self.held.for_cleanup(), cleanup_call, self.dists)
        if error is not None and sys.exc_info()[0] is None:
            raise error
        for proposal in (*self.held.compiling, *self.held.measuring):
            self.search.withdraw(proposal.config)
        for lane in self.lanes:
            lane.close()
        if self.own_pool:
            close_pool(self.pool)


def tune(
    study: optuna.Study,
    space: Space,
    problem: Problem,
    device: DeviceLimits,
    measure: Measure | Sequence[Measure],
    settings: TuneSettings,
    *,
    search: Search,
    compiler: Compile = compile_outcome,
    progress: Callable[[dict[str, Any]], None] | None = None,
    pool: cf.Executor | None = None,
    seed: int | None = None,
) -> TuneSummary:
    """Run trials until the study holds ``settings.n_trials`` evaluated trials, time is up, or the space is
    exhausted (see :class:`TuneLoop`). ``measure``: one per GPU; ``search``: what proposes the configs;
    ``pool``: a compile pool (default: one of the loop's own); ``seed``: the loop's own random draws."""
    return TuneLoop(
        study,
        space,
        problem,
        device,
        measure,
        settings,
        search=search,
        compiler=compiler,
        progress=progress,
        pool=pool,
        seed=seed,
    ).run()


# -- helpers ---------------------------------------------------------------------------------------
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

    # SIGTERM and SIGHUP (``docker stop``, Slurm, a closed terminal) stop the tuner as Ctrl-C does
    signums = [getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n)]
    previous = {signum: signal.signal(signum, on_ctrl_c) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if caught:
        handler = previous.get(caught[0])
        if callable(handler):
            handler(caught[0], None)  # raises KeyboardInterrupt; the command's own handler notes the signal
        raise KeyboardInterrupt


def _unseen_feasible(
    space: Space, problem: Problem, device: DeviceLimits, taken: set[str], rng: random.Random, tries: int = 10_000
) -> Config | None:
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
    return {
        name: trial.suggest_int(name, dist.low, dist.high, step=dist.step)
        if isinstance(dist, IntDistribution)
        else trial.suggest_categorical(name, dist.choices)
        for name, dist in dists.items()
    }


def _measured(result: MeasureResult, attrs: dict[str, Any]) -> Outcome[MeasureResult]:
    """A measurement as the trial's outcome: its figures stored beside the compile's ``attrs``; its TFLOPS
    the value when it is ok, its detail the reason when it is not."""
    figures = {k: v for k, v in result.to_dict().items() if k not in ("status", "detail")}
    stored = {**attrs, st.MEASUREMENT: figures}
    if result.ok:
        return Outcome(status=Status.OK, payload=result, value=result.tflops, attrs=stored)
    return Outcome(status=result.status, reason=result.detail, payload=result, attrs=stored)


def _kernel_seconds(result: MeasureResult) -> float:
    """GPU time a measurement spent in the kernel: what the worker reports, else latency x repetitions."""
    if result.kernel_ms is not None:
        return result.kernel_ms / 1e3
    return (result.latency_ms or 0.0) * (result.reps or 0) / 1e3
