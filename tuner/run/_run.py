"""Running a study on one host: one tuning loop drives the host's GPUs, a GPU worker each.

``flashtune tune`` creates (or resumes) the study, then calls :func:`run_on_gpus`; ``flashtune
worker`` joins an existing study from any host through :func:`spec_from_study`. Hosts share
nothing but the storage, so a study can take any number of them on a shared PostgreSQL
database. A suite (:func:`tune_suite`) gives each GPU a process of its own and its own studies.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import importlib
import math
import multiprocessing as mp
import os
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import optuna

from .. import study as st
from ..devices import DeviceLimits, gpu_unavailable
from ..errors import UsageError
from ..study import requeue_stale
from ..gpu import MeasureJob, MeasureResult, MeasureSettings
from ..problem import Problem
from ._progress import Progress
from ..search import make_sampler, make_search
from ..space import Config, Space, available_families, load_space
from ..study import mask_url, open_storage, retrying
from ..study import Suite
from ..text import printable
from ._threads import compile_pool
from ._loop import TuneSettings, TuneSummary, tune
from ._worker import Worker, WorkerError

__all__ = ["RunSpec", "compile_processes", "gpu_infos", "open_gpus", "prepare_study", "retime_winner", "run_on_gpus",
           "spec_from_study", "tune_suite", "warm_start_configs"]


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """Everything a tuning process needs; picklable, so each GPU's process gets a copy."""

    family: str
    problem: Problem
    storage_url: str
    study_name: str = ""
    sampler: str = "pattern"
    seed: int | None = None
    settings: TuneSettings = field(default_factory=TuneSettings)
    handler: str = "tuner.gpu._measure"  # the GPU worker's module (tests substitute a stand-in)
    compiler: str = "tuner.compile:compile_outcome"  # "module:function" run in the compile pool


@contextlib.contextmanager
def open_gpus(gpus: list[int],
              handler: str = "tuner.gpu._measure") -> Iterator[tuple[list[Worker], list[dict[str, Any]]]]:
    """A GPU worker per GPU, all started at once, and what each GPU reports; refuses a mix of GPU models
    (their timings do not compare). The workers are closed on leaving."""
    workers = [Worker(device=index, handler=handler) for index in gpus]

    def info(worker: Worker) -> dict[str, Any]:
        try:
            return worker.call("device_info", timeout_s=120)
        except WorkerError as e:
            raise gpu_unavailable(worker.device, str(e)) from None

    try:
        with cf.ThreadPoolExecutor(max_workers=len(gpus)) as pool:
            infos = list(pool.map(info, workers))
        names = {i["name"] for i in infos}
        if len(names) > 1:
            raise UsageError(f"GPUs {gpus} are different models ({', '.join(sorted(names))}); their timings do not "
                             "compare: tune each model in its own study (--gpus with one model)")
        yield workers, infos
    finally:
        for worker in workers:
            worker.close()


def gpu_infos(gpus: list[int], handler: str = "tuner.gpu._measure") -> list[dict[str, Any]]:
    """What each GPU's worker reports (see :func:`open_gpus`); the workers are closed again."""
    with open_gpus(gpus, handler) as (_, infos):
        return infos


def prepare_study(spec: RunSpec, info: dict[str, Any]) -> RunSpec:
    """Create or resume the study and record how to join it; returns the spec with the study's name."""
    space = load_space(spec.family)
    unsupported = space.supports(spec.problem)
    if unsupported:
        raise UsageError(unsupported)
    device = DeviceLimits.from_info(info)
    wrong_arch = space.runs_on(device.arch)
    if wrong_arch:
        others = [f for f in available_families() if load_space(f).runs_on(device.arch) is None]
        raise UsageError(f"{wrong_arch} ({info['name']})"
                         + (f"; families that run there: {', '.join(others)}" if others else ""))
    storage = _open(spec.storage_url)
    name = spec.study_name or st.default_study_name(space, device.arch, str(info["name"]), spec.problem)
    study = st.open_study(storage=storage, name=name, space=space, problem=spec.problem, gpu=info,
                          sampler=make_sampler(spec.sampler, space, spec.seed))
    study.set_user_attr(st.RUN, {"sampler": spec.sampler, "seed": spec.seed, "target_trials": spec.settings.n_trials})
    return dataclasses.replace(spec, study_name=name)


def warm_start_configs(storage: optuna.storages.BaseStorage, space: Space, problem: Problem, device: DeviceLimits,
                       gpu_name: str, *, limit: int = 3) -> list[tuple[str, Config]]:
    """(study, winner) of the flashtune studies nearest to ``problem`` that share its family, GPU model,
    dtype and head dim, at most ``limit`` distinct configs, each feasible for ``problem`` and not its
    default: nearest by causal flag first, then by sequence length (log scale), then batch and heads."""
    def distance(other: Problem) -> tuple[float, ...]:
        return (other.causal != problem.causal, abs(math.log2(other.seqlen_q / problem.seqlen_q)),
                abs(math.log2(other.seqlen_k / problem.seqlen_k)), abs(math.log2(other.batch / problem.batch)),
                abs(math.log2(other.heads_q / problem.heads_q)))

    candidates = []
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        attrs = summary.user_attrs
        if not isinstance(attrs.get("flashtune"), dict) or attrs.get("family") != space.name:
            continue
        if (attrs.get("gpu") or {}).get("name") != gpu_name or attrs.get("space_digest") != st.space_digest(space):
            continue
        try:
            other = Problem.from_dict(dict(attrs.get("problem") or {}))
        except (TypeError, ValueError):
            continue
        if other == problem or (other.dtype, other.head_dim) != (problem.dtype, problem.head_dim):
            continue
        candidates.append((distance(other), summary.study_name))
    chosen: list[tuple[str, Config]] = []
    default = space.defaults(problem.head_dim)
    for _, name in sorted(candidates):
        try:
            won = st.winner(optuna.load_study(study_name=name, storage=storage))
            config = space.validate(won["config"]) if won else None
        except (KeyError, TypeError, ValueError):
            continue
        if (config is None or config == default or any(config == c for _, c in chosen)
                or space.check(config, problem, device) is not None):
            continue
        chosen.append((name, config))
        if len(chosen) == limit:
            break
    return chosen


def spec_from_study(storage_url: str, study_name: str, *, n_trials: int | None = None,
                    settings: TuneSettings | None = None) -> RunSpec:
    """The spec of an existing study, for `flashtune worker` on another host."""
    storage = open_storage(storage_url, create=False, stale_trial_callback=requeue_stale)
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        raise UsageError(f"no study named {printable(study_name, 200)!r} in {mask_url(storage_url)}; create it with "
                         "`flashtune tune` first (`flashtune studies` lists what is there)") from None
    meta = st.StudyMeta.read(study)
    base = settings or TuneSettings()
    target = n_trials if n_trials is not None else meta.run.get("target_trials", base.n_trials)
    return RunSpec(family=meta.family, problem=meta.problem, storage_url=storage_url, study_name=study_name,
                   sampler=meta.run.get("sampler", "pattern"), seed=meta.run.get("seed"),
                   settings=dataclasses.replace(base, n_trials=target))


def retime_winner(spec: RunSpec, gpu: int, *, top_k: int, rounds: int, worker: Worker | None = None) -> optuna.Study:
    """Re-time the study's best ``top_k`` configs and the default on ``gpu`` (``top_k`` 0: none), with
    ``worker`` when given (else one of its own); the winner is stored on the study. Returns the study."""
    from ._retime import retime_top

    study = optuna.load_study(study_name=spec.study_name, storage=_open(spec.storage_url))
    if top_k > 0:
        print(f"re-timing the configs within the noise of the best (at most {top_k}) and the default, "
              f"{rounds} rounds ...", file=sys.stderr)
        with contextlib.ExitStack() as stack:
            if worker is None:
                worker = stack.enter_context(Worker(device=gpu, handler=spec.handler))
            device = DeviceLimits.from_info(worker.call("device_info", timeout_s=120))
            timeout = spec.settings.trial_timeout_s
            retime_top(study, load_space(spec.family), spec.problem, device,
                       lambda job: worker.measure(job, timeout_s=timeout), top_k=top_k, rounds=rounds,
                       settings=spec.settings.measure)
    return study


def tune_suite(suite: Suite, base: RunSpec, gpus: list[int], infos: list[dict[str, Any]], *, top_k: int,
               rounds: int, on_done: Callable[[optuna.Study], Any] | None = None) -> None:
    """Tune every problem of ``suite`` as one ``flashtune tune`` would (``base`` gives storage, sampler, seed
    and settings), skipping finished studies, so that rerunning resumes, and re-time each winner. Each GPU
    keeps one measuring process and one compile pool for all its studies; with several GPUs the studies
    are shared out, one GPU per study, in suite order. A new study starts from the winners of the nearest
    shapes already tuned (:func:`warm_start_configs`), enqueued after the default. ``on_done`` gets each
    finished study (with several GPUs, in the GPU's process: it must be picklable)."""
    from ..study import is_finished

    space = load_space(suite.family)
    storage = _open(base.storage_url)
    device = DeviceLimits.from_info(infos[0])
    todo: list[tuple[str, Problem]] = []
    for i, problem in enumerate(suite.problems, 1):
        name = st.default_study_name(space, device.arch, str(infos[0]["name"]), problem)
        head = f"suite {suite.name} [{i}/{len(suite.problems)}] {problem.slug()}"
        if is_finished(storage, name, base.settings.n_trials):
            print(f"{head}: study {name} is finished, skipped", file=sys.stderr)
        else:
            todo.append((head, problem))
    base = dataclasses.replace(base, family=suite.family, study_name="")
    if len(gpus) == 1:
        _suite_on_gpu(base, todo, gpus[0], infos[0], top_k, rounds, on_done, label="")
        return
    share = max(1, base.settings.compile_workers // len(gpus))
    per_gpu = dataclasses.replace(base, settings=dataclasses.replace(base.settings, compile_workers=share))
    ctx = mp.get_context("spawn")
    processes = [ctx.Process(target=_suite_process, name=f"flashtune-suite-gpu-{g}",
                             args=(per_gpu, todo[i::len(gpus)], g, info, top_k, rounds, on_done, f"[gpu {g}] "))
                 for i, (g, info) in enumerate(zip(gpus, infos))]
    for p in processes:
        p.start()
    try:
        for p in processes:
            p.join()
    finally:
        for p in processes:
            if p.is_alive():
                p.terminate()
    failed = [g for g, p in zip(gpus, processes) if p.exitcode != 0]
    if failed:
        raise UsageError(f"the suite process of GPU(s) {failed} failed (see its messages above); finished trials "
                         "are stored: rerun the same command to resume")


def _suite_process(base: RunSpec, todo: list[tuple[str, Problem]], gpu: int, info: dict[str, Any], top_k: int,
                   rounds: int, on_done: Callable[[optuna.Study], Any] | None, label: str) -> None:
    try:
        _suite_on_gpu(base, todo, gpu, info, top_k, rounds, on_done, label)
    except Exception as e:  # noqa: BLE001 - reported here, counted as a failure by the parent
        print(f"{label}error: {e}", file=sys.stderr)
        raise SystemExit(1) from None


def _suite_on_gpu(base: RunSpec, todo: list[tuple[str, Problem]], gpu: int, info: dict[str, Any], top_k: int,
                  rounds: int, on_done: Callable[[optuna.Study], Any] | None, label: str) -> None:
    """The studies ``todo`` on one GPU, with one measuring process and one compile pool for all of them."""
    space = load_space(base.family)
    storage = _open(base.storage_url)
    device = DeviceLimits.from_info(info)
    with Worker(device=gpu, handler=base.handler) as worker, compile_processes(base.settings) as pool:
        for head, problem in todo:
            spec = prepare_study(dataclasses.replace(base, problem=problem), info)
            print(f"{label}{head}: study {spec.study_name}", file=sys.stderr)
            study = optuna.load_study(study_name=spec.study_name, storage=storage)
            if not study.user_attrs.get(st.WARM_START):  # once per study, however often the suite is rerun
                starts = warm_start_configs(storage, space, problem, device, str(info["name"]))
                for source, config in starts:
                    study.enqueue_trial(config, user_attrs={st.WARM_START: source})
                study.set_user_attr(st.WARM_START, [source for source, _ in starts] or ["none"])
                if starts:
                    print(f"{label}{head}: starts from the winners of {', '.join(s for s, _ in starts)}",
                          file=sys.stderr)
            run_on_gpu(spec, gpu, label, workers=[worker], pool=pool)
            study = retime_winner(spec, gpu, top_k=top_k, rounds=rounds, worker=worker)
            if on_done is not None:
                on_done(study)


@contextlib.contextmanager
def compile_processes(settings: TuneSettings) -> Iterator[cf.Executor]:
    """A run's compile pool, shared by every study the run tunes, shut on leaving. Its processes start with
    the first compiles, not ahead: a pool shut while its children still spawn (no GPU found, nothing left
    to tune) made the process exit with an error."""
    pool = compile_pool(settings.compile_workers)
    try:
        yield pool
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def run_on_gpus(spec: RunSpec, gpus: list[int], infos: list[dict[str, Any]], *, workers: list[Worker] | None = None,
                pool: cf.Executor | None = None) -> TuneSummary:
    """Tune ``spec``'s study on ``gpus`` of this host: one loop, one search and one compile pool, a GPU
    worker per GPU (see :mod:`tuner.tune`); the workers (:func:`open_gpus`) and pool given, else its own."""
    stored_gpu = _stored_gpu_name(spec)
    for index, info in zip(gpus, infos):
        if info["name"] != stored_gpu:
            raise UsageError(f"GPU {index} is {info['name']!r} but study {spec.study_name!r} is measured on "
                             f"{stored_gpu!r}; timings do not compare")
    return run_on_gpu(spec, gpus, info=infos[0], workers=workers, pool=pool)


def run_on_gpu(spec: RunSpec, gpus: int | list[int], label: str = "", *, workers: list[Worker] | None = None,
               pool: cf.Executor | None = None, info: dict[str, Any] | None = None) -> TuneSummary:
    """One tuning loop on ``gpus`` (one GPU, or several of this host) with its own storage connection and
    search; the GPU workers (one per GPU, in order) and compile pool given (a suite shares them across its
    studies), else its own. ``info``: what the GPUs reported (:func:`open_gpus`), else the first worker is
    asked; given, the loop starts compiling while new workers start."""
    gpus = [gpus] if isinstance(gpus, int) else list(gpus)
    if workers is not None and [w.device for w in workers] != gpus:
        raise ValueError(f"workers for GPUs {[w.device for w in workers]} given to measure on GPUs {gpus}")
    space = load_space(spec.family)
    storage = _open(spec.storage_url)
    seed = None if spec.seed is None else spec.seed + 7919 * gpus[0] + _host_salt()
    study = retrying(lambda: optuna.load_study(study_name=spec.study_name, storage=storage), what="loading the study")
    module, _, function = spec.compiler.partition(":")
    compiler = getattr(importlib.import_module(module), function)
    with contextlib.ExitStack() as stack:
        if workers is None:
            workers = [stack.enter_context(Worker(device=g, handler=spec.handler)) for g in gpus]
        if info is None:
            info = workers[0].call("device_info", timeout_s=120)
        device = DeviceLimits.from_info(info)
        timeout = spec.settings.trial_timeout_s
        search = make_search(spec.sampler, space, spec.problem, device, seed)
        measures = [_WorkerGpu(w, timeout) for w in workers]
        summary = tune(study, space, spec.problem, device, measures, spec.settings, search=search, compiler=compiler,
                       progress=Progress(prefix=label), pool=pool)
    s = search.stats
    restarts = sum(w.restarts for w in workers)
    print(f"{label}stopped: {summary.stopped_because}; this process: {summary.evaluated} evaluated, "
          f"{summary.failed} failed, {summary.explorations} explorations, {summary.duplicates} duplicate enqueued "
          f"configs, {restarts} worker restarts; search: {s.asks} proposals drawn, {s.infeasible} "
          f"infeasible (repaired), {s.repeats} repeats", file=sys.stderr)
    if summary.stats is not None:
        print(f"{label}throughput: {summary.stats.line()}", file=sys.stderr)
    return summary


@dataclass(frozen=True)
class _WorkerGpu:
    """A GPU as the tuning loop measures on it: its worker process, each job within ``timeout_s``."""

    worker: Worker
    timeout_s: float

    def __call__(self, job: MeasureJob) -> MeasureResult:
        return self.worker.measure(job, timeout_s=self.timeout_s)

    def prepare(self, problem: Problem, settings: MeasureSettings) -> None:
        """The problem's inputs and the worker's warm-up, before the first job (a handler without it: skipped;
        a failure shows again, and is dealt with, in the first job)."""
        with contextlib.suppress(WorkerError):
            self.worker.call("prepare", (problem, settings), timeout_s=max(self.timeout_s, 300.0))


def _stored_gpu_name(spec: RunSpec) -> str:
    study = optuna.load_study(study_name=spec.study_name, storage=_open(spec.storage_url))
    return st.StudyMeta.read(study).gpu_name


def _open(url: str) -> optuna.storages.RDBStorage:
    """A tuner's storage: a trial whose tuner died is failed and its config enqueued again."""
    return open_storage(url, stale_trial_callback=requeue_stale)


def _host_salt() -> int:
    """Different hosts joining one study should not draw the same random proposals."""
    return hash((socket.gethostname(), os.getpid())) % 100_000
