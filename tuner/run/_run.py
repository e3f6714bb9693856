"""Running a study on one host: one tuning loop drives the host's GPUs, a GPU worker each.

``flashtune tune`` creates (or resumes) the study (:func:`prepare_study`), then calls
:func:`run_on_gpus`; ``flashtune worker`` joins an existing study from any host through
:func:`join_study`. Either gives a :class:`TuningRun`: the picklable :class:`RunSpec` (names only,
what another process gets) with the space, storage and study it names, resolved once in this
process and passed down to the loop and the re-timing. Hosts share nothing but the storage, so a
study can take any number of them on a shared PostgreSQL database. A suite (:func:`tune_suite`)
gives each GPU a process of its own and its own studies.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import importlib
import math
import multiprocessing as mp
import socket
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import optuna

from .. import study as st
from ..devices import DeviceLimits, gpu_unavailable
from ..errors import UsageError
from ..gpu import GpuHandler, MeasureJob, MeasureResult, MeasureSettings
from ..problem import Problem
from ..search import DEFAULT_SEARCH, make_sampler, make_search
from ..space import Config, Space, available_families, load_space
from ..study import Suite, mask_url, open_storage, requeue_stale
from ..text import printable
from ._loop import TuneSettings, TuneSummary, tune
from ._progress import Progress
from ._retime import DEFAULT_NOISE_FLOOR
from ._threads import close_pool, compile_pool
from ._worker import Worker, WorkerError

__all__ = [
    "RunSpec",
    "TuningRun",
    "compile_processes",
    "gpu_infos",
    "join_study",
    "open_gpus",
    "prepare_study",
    "retime_winner",
    "run_on_gpus",
    "tune_suite",
    "warm_start_configs",
]

# keys of the study's ``run`` attribute (tuner.study.RUN): how the study is tuned
_SAMPLER, _SEED, _TARGET_TRIALS = "sampler", "seed", "target_trials"


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """Everything a tuning process needs; picklable, so each GPU's process gets a copy."""

    family: str
    problem: Problem
    storage_url: str
    study_name: str = ""
    sampler: str = DEFAULT_SEARCH  # the search's name (tuner.search.SEARCHES)
    seed: int | None = None
    settings: TuneSettings = field(default_factory=TuneSettings)
    # the smallest lead over the default that makes a re-timed config the winner (retime_winner)
    noise_floor: float = DEFAULT_NOISE_FLOOR
    handler: type[GpuHandler] | None = None  # the GPU worker's handler (None: CupyHandler; tests substitute one)
    compiler: str = "tuner.compile:compile_outcome"  # "module:function" run in the compile pool


@dataclass(frozen=True, kw_only=True)
class TuningRun:
    """A study opened in this process: its :class:`RunSpec` and what the spec names, resolved once (the space
    loaded, the storage opened, the study loaded). Made by :func:`prepare_study` or :func:`join_study`."""

    spec: RunSpec
    space: Space
    storage: optuna.storages.BaseStorage
    study: optuna.Study

    @property
    def study_name(self) -> str:
        return self.spec.study_name

    @property
    def storage_url(self) -> str:
        return self.spec.storage_url

    @property
    def settings(self) -> TuneSettings:
        return self.spec.settings


@contextlib.contextmanager
def open_gpus(
    gpus: list[int], handler: type[GpuHandler] | None = None
) -> Iterator[tuple[list[Worker], list[dict[str, Any]]]]:
    """A GPU worker per GPU, all started at once, and what each GPU reports; refuses a mix of GPU models
    (their timings do not compare). The workers are closed on leaving."""
    workers = [Worker(device=index, handler=handler) for index in gpus]

    def info(worker: Worker) -> dict[str, Any]:
        try:
            return worker.device_info(timeout_s=120)
        except WorkerError as e:
            raise gpu_unavailable(worker.device, str(e)) from None

    try:
        with cf.ThreadPoolExecutor(max_workers=len(gpus)) as pool:
            infos = list(pool.map(info, workers))
        names = {i["name"] for i in infos}
        if len(names) > 1:
            raise UsageError(
                f"GPUs {gpus} are different models ({', '.join(sorted(names))}); their timings do not "
                "compare: tune each model in its own study (--gpus with one model)"
            )
        yield workers, infos
    finally:
        for worker in workers:
            worker.close()


def gpu_infos(gpus: list[int], handler: type[GpuHandler] | None = None) -> list[dict[str, Any]]:
    """What each GPU's worker reports (see :func:`open_gpus`); the workers are closed again."""
    with open_gpus(gpus, handler) as (_, infos):
        return infos


def prepare_study(
    spec: RunSpec,
    info: dict[str, Any],
    *,
    space: Space | None = None,
    storage: optuna.storages.BaseStorage | None = None,
) -> TuningRun:
    """Create or resume the study and record how to join it. ``space`` and ``storage``: the spec's family
    and storage when the caller has them open already (else loaded and opened here)."""
    space = space if space is not None else load_space(spec.family)
    unsupported = space.supports(spec.problem)
    if unsupported:
        raise UsageError(unsupported)
    device = DeviceLimits.from_info(info)
    wrong_arch = space.runs_on(device.arch)
    if wrong_arch:
        others = [f for f in available_families() if load_space(f).runs_on(device.arch) is None]
        raise UsageError(
            f"{wrong_arch} ({info['name']})" + (f"; families that run there: {', '.join(others)}" if others else "")
        )
    storage = storage if storage is not None else _open(spec.storage_url)
    name = spec.study_name or st.default_study_name(space, device.arch, str(info["name"]), spec.problem)
    study = st.open_study(
        storage=storage,
        name=name,
        space=space,
        problem=spec.problem,
        gpu=info,
        sampler=make_sampler(spec.sampler, space, spec.seed),
    )
    study.set_user_attr(st.RUN, {_SAMPLER: spec.sampler, _SEED: spec.seed, _TARGET_TRIALS: spec.settings.n_trials})
    return TuningRun(spec=dataclasses.replace(spec, study_name=name), space=space, storage=storage, study=study)


def warm_start_configs(
    storage: optuna.storages.BaseStorage,
    space: Space,
    problem: Problem,
    device: DeviceLimits,
    gpu_name: str,
    *,
    limit: int = 3,
) -> list[tuple[str, Config]]:
    """(study, winner) of the flashtune studies nearest to ``problem`` that share its family, GPU model,
    dtype and head dim, at most ``limit`` distinct configs, each feasible for ``problem`` and not its
    default: nearest by causal flag first, then by sequence length (log scale), then batch and heads."""

    def distance(other: Problem) -> tuple[float, ...]:
        return (
            other.causal != problem.causal,
            abs(math.log2(other.seqlen_q / problem.seqlen_q)),
            abs(math.log2(other.seqlen_k / problem.seqlen_k)),
            abs(math.log2(other.batch / problem.batch)),
            abs(math.log2(other.heads_q / problem.heads_q)),
        )

    candidates = []
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        attrs = summary.user_attrs
        if not isinstance(attrs.get(st.MADE_BY), dict) or attrs.get(st.FAMILY) != space.name:
            continue
        if (attrs.get(st.GPU) or {}).get("name") != gpu_name or attrs.get(st.SPACE_DIGEST) != st.space_digest(space):
            continue
        try:
            other = Problem.from_dict(dict(attrs.get(st.PROBLEM) or {}))
        except (TypeError, ValueError):
            continue
        if other == problem or (other.dtype, other.head_dim) != (problem.dtype, problem.head_dim):
            continue
        candidates.append((distance(other), summary.study_name))
    chosen: list[tuple[str, Config]] = []
    default = space.defaults(problem=problem, device=device)
    for _, name in sorted(candidates):
        try:
            won = st.winner(optuna.load_study(study_name=name, storage=storage))
            config = space.validate(won["config"]) if won else None
        except (KeyError, TypeError, ValueError):
            continue
        if (
            config is None
            or config == default
            or any(config == c for _, c in chosen)
            or space.check(config, problem, device) is not None
        ):
            continue
        chosen.append((name, config))
        if len(chosen) == limit:
            break
    return chosen


def join_study(
    storage_url: str, study_name: str, *, n_trials: int | None = None, settings: TuneSettings | None = None
) -> TuningRun:
    """An existing study, opened for `flashtune worker` on another host, with the spec it was created with."""
    storage = open_storage(storage_url, create=False, read_only=False, stale_trial_callback=requeue_stale)
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        raise UsageError(
            f"no study named {printable(study_name, 200)!r} in {mask_url(storage_url)}; create it with "
            f"`flashtune tune` first ({st.listing_hint(storage_url)})"
        ) from None
    meta = st.StudyMeta.read(study)
    base = settings or TuneSettings()
    target = n_trials if n_trials is not None else meta.run.get(_TARGET_TRIALS, base.n_trials)
    spec = RunSpec(
        family=meta.family,
        problem=meta.problem,
        storage_url=storage_url,
        study_name=study_name,
        sampler=meta.run.get(_SAMPLER, DEFAULT_SEARCH),
        seed=meta.run.get(_SEED),
        settings=dataclasses.replace(base, n_trials=target),
    )
    space = load_space(spec.family)
    meta.check_sources(space)  # a worker never measures a changed kernel into the study
    return TuningRun(spec=spec, space=space, storage=storage, study=study)


def retime_winner(
    run: TuningRun,
    gpu: int,
    *,
    top_k: int,
    rounds: int,
    worker: Worker | None = None,
    noise_floor: float | None = None,
) -> optuna.Study:
    """Re-time the study's best trial, the others within its noise (at most ``top_k`` in all) and the
    default on ``gpu`` (``top_k`` 0: none), with ``worker`` when given (else one of its own); the winner,
    the default unless a config beats it beyond noise (at least ``noise_floor``, default the spec's),
    is stored on the study. Returns the study."""
    from ._retime import retime_top

    spec = run.spec
    floor = spec.noise_floor if noise_floor is None else noise_floor
    if top_k > 0:
        print(
            f"re-timing the best config, those within its noise (at most {top_k} in all) and the default, "
            f"{rounds} interleaved rounds; a win needs a lead beyond the noise, at least {floor:.1%} ...",
            file=sys.stderr,
        )
        with contextlib.ExitStack() as stack:
            if worker is None:
                worker = stack.enter_context(Worker(device=gpu, handler=spec.handler))
            device = DeviceLimits.from_info(worker.device_info(timeout_s=120))
            timeout = spec.settings.trial_timeout_s
            retime_top(
                run.study,
                run.space,
                spec.problem,
                device,
                lambda job: worker.measure(job, timeout_s=timeout),
                top_k=top_k,
                rounds=rounds,
                noise_floor=floor,
                seed=spec.seed,
                settings=spec.settings.measure,
            )
    return run.study


def tune_suite(
    suite: Suite,
    base: RunSpec,
    gpus: list[int],
    infos: list[dict[str, Any]],
    *,
    top_k: int,
    rounds: int,
    on_done: Callable[[optuna.Study], Any] | None = None,
) -> None:
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
        _suite_on_gpu(base, todo, gpus[0], infos[0], top_k, rounds, on_done, label="", space=space, storage=storage)
        return
    share = max(1, base.settings.compile_workers // len(gpus))
    per_gpu = dataclasses.replace(base, settings=dataclasses.replace(base.settings, compile_workers=share))
    ctx = mp.get_context("spawn")
    processes = [
        ctx.Process(
            target=_suite_process,
            name=f"flashtune-suite-gpu-{g}",
            args=(per_gpu, todo[i :: len(gpus)], g, info, top_k, rounds, on_done, f"[gpu {g}] "),
        )
        for i, (g, info) in enumerate(zip(gpus, infos))
    ]
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
        raise UsageError(
            f"the suite process of GPU(s) {failed} failed (see its messages above); finished trials "
            "are stored: rerun the same command to resume"
        )


def _suite_process(
    base: RunSpec,
    todo: list[tuple[str, Problem]],
    gpu: int,
    info: dict[str, Any],
    top_k: int,
    rounds: int,
    on_done: Callable[[optuna.Study], Any] | None,
    label: str,
) -> None:
    try:
        _suite_on_gpu(base, todo, gpu, info, top_k, rounds, on_done, label)
    except Exception as e:
        print(f"{label}error: {e}", file=sys.stderr)
        raise SystemExit(1) from None


def _suite_on_gpu(
    base: RunSpec,
    todo: list[tuple[str, Problem]],
    gpu: int,
    info: dict[str, Any],
    top_k: int,
    rounds: int,
    on_done: Callable[[optuna.Study], Any] | None,
    label: str,
    *,
    space: Space | None = None,
    storage: optuna.storages.BaseStorage | None = None,
) -> None:
    """The studies ``todo`` on one GPU, with one measuring process and one compile pool for all of them, and
    the family's space and the storage opened once (given, or opened here: in a GPU's own process)."""
    space = space if space is not None else load_space(base.family)
    storage = storage if storage is not None else _open(base.storage_url)
    device = DeviceLimits.from_info(info)
    with Worker(device=gpu, handler=base.handler) as worker, compile_processes(base.settings) as pool:
        for head, problem in todo:
            run = prepare_study(dataclasses.replace(base, problem=problem), info, space=space, storage=storage)
            print(f"{label}{head}: study {run.study_name}", file=sys.stderr)
            study = run.study
            if not study.user_attrs.get(st.WARM_START):  # once per study, however often the suite is rerun
                starts = warm_start_configs(storage, space, problem, device, str(info["name"]))
                for source, config in starts:
                    study.enqueue_trial(config, user_attrs={st.WARM_START: source})
                study.set_user_attr(st.WARM_START, [source for source, _ in starts] or ["none"])
                if starts:
                    print(
                        f"{label}{head}: starts from the winners of {', '.join(s for s, _ in starts)}", file=sys.stderr
                    )
            run_on_gpu(run, gpu, label, workers=[worker], pool=pool)
            study = retime_winner(run, gpu, top_k=top_k, rounds=rounds, worker=worker)
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
        close_pool(pool)


def run_on_gpus(
    run: TuningRun,
    gpus: list[int],
    infos: list[dict[str, Any]],
    *,
    workers: list[Worker] | None = None,
    pool: cf.Executor | None = None,
) -> TuneSummary:
    """Tune ``run``'s study on ``gpus`` of this host: one loop, one search and one compile pool, a GPU
    worker per GPU (see :mod:`._loop`); the workers (:func:`open_gpus`) and pool given, else its own."""
    stored_gpu = st.StudyMeta.read(run.study).gpu_name
    for index, info in zip(gpus, infos):
        if info["name"] != stored_gpu:
            raise UsageError(
                f"GPU {index} is {info['name']!r} but study {run.study_name!r} is measured on "
                f"{stored_gpu!r}; timings do not compare"
            )
    return run_on_gpu(run, gpus, info=infos[0], workers=workers, pool=pool)


def run_on_gpu(
    run: TuningRun,
    gpus: int | list[int],
    label: str = "",
    *,
    workers: list[Worker] | None = None,
    pool: cf.Executor | None = None,
    info: dict[str, Any] | None = None,
) -> TuneSummary:
    """One tuning loop on ``gpus`` (one GPU, or several of this host) with its own search, on ``run``'s study;
    the GPU workers (one per GPU, in order) and compile pool given (a suite shares them across its studies),
    else its own. ``info``: what the GPUs reported (:func:`open_gpus`), else the first worker is asked;
    given, the loop starts compiling while new workers start. The search and the loop's own draws follow
    the spec's seed (salted by host and GPU, so that hosts and GPUs on one study propose apart)."""
    spec = run.spec
    gpus = [gpus] if isinstance(gpus, int) else list(gpus)
    if workers is not None and [w.device for w in workers] != gpus:
        raise ValueError(f"workers for GPUs {[w.device for w in workers]} given to measure on GPUs {gpus}")
    seed = None if spec.seed is None else spec.seed + 7919 * gpus[0] + _host_salt()
    module, _, function = spec.compiler.partition(":")
    compiler = getattr(importlib.import_module(module), function)
    with contextlib.ExitStack() as stack:
        if workers is None:
            workers = [stack.enter_context(Worker(device=g, handler=spec.handler)) for g in gpus]
        if info is None:
            info = workers[0].device_info(timeout_s=120)
        device = DeviceLimits.from_info(info)
        timeout = spec.settings.trial_timeout_s
        search = make_search(spec.sampler, run.space, spec.problem, device, seed)
        measures = [_WorkerGpu(w, timeout) for w in workers]
        summary = tune(
            run.study,
            run.space,
            spec.problem,
            device,
            measures,
            spec.settings,
            search=search,
            compiler=compiler,
            progress=Progress(prefix=label),
            pool=pool,
            seed=seed,
        )
    s = search.stats
    restarts = sum(w.restarts for w in workers)
    print(
        f"{label}stopped: {summary.stopped_because}; this process: {summary.evaluated} evaluated, "
        f"{summary.failed} failed, {summary.explorations} explorations, {summary.duplicates} duplicate enqueued "
        f"configs, {restarts} worker restarts; search: {s.asks} proposals drawn, {s.infeasible} "
        f"infeasible (repaired), {s.repeats} repeats",
        file=sys.stderr,
    )
    if summary.stats is not None:
        print(f"{label}throughput: {summary.stats.line()}", file=sys.stderr)
    return summary


@dataclass(frozen=True)
class _WorkerGpu:
    """A GPU as the tuning loop measures on it: its worker process, each job within ``timeout_s``."""

    worker: Worker
    timeout_s: float

    def measure(self, job: MeasureJob) -> MeasureResult:
        return self.worker.measure(job, timeout_s=self.timeout_s)

    def prepare(self, problem: Problem, settings: MeasureSettings) -> None:
        """The problem's inputs and the worker's warm-up, before the first job (a failure shows again,
        and is dealt with, in the first job)."""
        with contextlib.suppress(WorkerError):
            self.worker.prepare(problem, settings, timeout_s=max(self.timeout_s, 300.0))


def _open(url: str) -> optuna.storages.RDBStorage:
    """A tuner's storage: a trial whose tuner died is failed and its config enqueued again."""
    return open_storage(url, stale_trial_callback=requeue_stale)


def _host_salt() -> int:
    """Different hosts joining one study should not draw the same random proposals; a host's salt is the
    same in every run, so that a seeded run repeats."""
    return zlib.crc32(socket.gethostname().encode()) % 100_000
