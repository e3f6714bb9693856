"""Running a study on one host: one measuring process per GPU, all on the same stored study.

``flashtune tune`` creates (or resumes) the study, then calls :func:`run_on_gpus`; ``flashtune
worker`` joins an existing study from any host through :func:`spec_from_study`. Every GPU gets
its own process with its own GPU worker and compile-ahead pool; they share nothing but the
storage, so a study can take any number of hosts on a shared PostgreSQL database.
"""

from __future__ import annotations

import dataclasses
import importlib
import multiprocessing as mp
import os
import socket
import sys
from dataclasses import dataclass, field
from typing import Any

import optuna

from . import study as st
from .devices import DeviceLimits
from .errors import UsageError
from .problem import Problem
from .progress import Progress
from .search import make_sampler
from .space import available_families, load_space
from .storage import mask_url, open_storage, retrying
from .tune import TuneSettings, TuneSummary, tune
from .worker import Worker, WorkerError

__all__ = ["RunSpec", "gpu_infos", "prepare_study", "run_on_gpus", "spec_from_study"]


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """Everything a tuning process needs; picklable, so each GPU's process gets a copy."""

    family: str
    problem: Problem
    storage_url: str
    study_name: str = ""
    sampler: str = "tpe"
    seed: int | None = None
    settings: TuneSettings = field(default_factory=TuneSettings)
    handler: str = "tuner.gpu.measure"  # the GPU worker's module (tests substitute a stand-in)
    compiler: str = "tuner.tune:compile_outcome"  # "module:function" run in the compile pool


def gpu_infos(gpus: list[int], handler: str = "tuner.gpu.measure") -> list[dict[str, Any]]:
    """What each GPU's worker reports; refuses a mix of GPU models (their timings do not compare)."""
    infos = []
    for index in gpus:
        with Worker(device=index, handler=handler) as worker:
            try:
                infos.append(worker.call("device_info", timeout_s=120))
            except WorkerError as e:
                raise UsageError(f"no usable GPU {index}: {str(e).splitlines()[-1]} "
                                 "(`flashtune check` compiles and checks a space without a GPU)") from None
    names = {info["name"] for info in infos}
    if len(names) > 1:
        raise UsageError(f"GPUs {gpus} are different models ({', '.join(sorted(names))}); their timings do not "
                         "compare: tune each model in its own study (--gpus with one model)")
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
    storage = open_storage(spec.storage_url)
    name = spec.study_name or st.default_study_name(space, device.arch, str(info["name"]), spec.problem)
    study = st.open_study(storage=storage, name=name, space=space, problem=spec.problem, gpu=info,
                          sampler=make_sampler(spec.sampler, space, spec.seed))
    study.set_user_attr("run", {"sampler": spec.sampler, "seed": spec.seed, "target_trials": spec.settings.n_trials})
    return dataclasses.replace(spec, study_name=name)


def spec_from_study(storage_url: str, study_name: str, *, n_trials: int | None = None,
                    settings: TuneSettings | None = None) -> RunSpec:
    """The spec of an existing study, for `flashtune worker` on another host."""
    storage = open_storage(storage_url, create=False)
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        raise UsageError(f"no study named {study_name!r} in {mask_url(storage_url)}; create it with `flashtune tune` "
                         "first (`flashtune studies` lists what is there)") from None
    if "flashtune" not in study.user_attrs:
        raise UsageError(f"study {study_name!r} was not created by flashtune")
    run = study.user_attrs.get("run", {})
    base = settings or TuneSettings()
    target = n_trials if n_trials is not None else run.get("target_trials", base.n_trials)
    return RunSpec(family=study.user_attrs["family"], problem=st.study_problem(study), storage_url=storage_url,
                   study_name=study_name, sampler=run.get("sampler", "tpe"), seed=run.get("seed"),
                   settings=dataclasses.replace(base, n_trials=target))


def run_on_gpus(spec: RunSpec, gpus: list[int], infos: list[dict[str, Any]]) -> list[TuneSummary]:
    """Tune ``spec``'s study with one process per GPU (in this process when there is one GPU)."""
    stored_gpu = _stored_gpu_name(spec)
    for index, info in zip(gpus, infos):
        if info["name"] != stored_gpu:
            raise UsageError(f"GPU {index} is {info['name']!r} but study {spec.study_name!r} is measured on "
                             f"{stored_gpu!r}; timings do not compare")
    if len(gpus) == 1:
        return [run_on_gpu(spec, gpus[0], label="")]
    share = max(1, spec.settings.compile_workers // len(gpus))
    per_gpu = dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, compile_workers=share))
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    # not a Pool: its processes are daemons, which may not start the GPU worker and compile processes
    processes = [ctx.Process(target=_gpu_process, args=(per_gpu, g, f"[gpu {g}] ", results), name=f"flashtune-gpu-{g}")
                 for g in gpus]
    for p in processes:
        p.start()
    summaries: dict[int, TuneSummary] = {}
    try:
        for p in processes:
            p.join()
        while not results.empty():
            gpu, summary = results.get()
            summaries[gpu] = summary
    finally:
        for p in processes:
            if p.is_alive():
                p.terminate()
    failed = [g for g, p in zip(gpus, processes) if p.exitcode != 0 or g not in summaries]
    if failed:
        raise UsageError(f"the tuning process of GPU(s) {failed} failed (see its messages above); finished trials "
                         "are stored: rerun to resume")
    return [summaries[g] for g in gpus]


def _gpu_process(spec: RunSpec, gpu: int, label: str, results) -> None:
    try:
        results.put((gpu, run_on_gpu(spec, gpu, label)))
    except Exception as e:  # noqa: BLE001 - reported here, counted as a failure by the parent
        print(f"{label}error: {e}", file=sys.stderr)
        raise SystemExit(1) from None


def run_on_gpu(spec: RunSpec, gpu: int, label: str = "") -> TuneSummary:
    """One GPU's tuning loop: its own storage connection, sampler, GPU worker and compile pool."""
    space = load_space(spec.family)
    storage = open_storage(spec.storage_url)
    seed = None if spec.seed is None else spec.seed + 7919 * gpu + _host_salt()
    study = retrying(lambda: optuna.load_study(study_name=spec.study_name, storage=storage,
                                               sampler=make_sampler(spec.sampler, space, seed)),
                     what="loading the study")
    module, _, function = spec.compiler.partition(":")
    compiler = getattr(importlib.import_module(module), function)
    with Worker(device=gpu, handler=spec.handler) as worker:
        info = worker.call("device_info", timeout_s=120)
        device = DeviceLimits.from_info(info)
        timeout = spec.settings.trial_timeout_s
        summary = tune(study, space, spec.problem, device, lambda job: worker.measure(job, timeout_s=timeout),
                       spec.settings, compiler=compiler, progress=Progress(prefix=label))
    print(f"{label}stopped: {summary.stopped_because}; this process: {summary.evaluated} evaluated, "
          f"{summary.infeasible} statically infeasible, {summary.failed} failed, {summary.duplicates} duplicate "
          f"proposals, {worker.restarts} worker restarts", file=sys.stderr)
    return summary


def _stored_gpu_name(spec: RunSpec) -> str:
    study = optuna.load_study(study_name=spec.study_name, storage=open_storage(spec.storage_url))
    return str((study.user_attrs.get("gpu") or {}).get("name"))


def _host_salt() -> int:
    """Different hosts joining one study should not draw the same random proposals."""
    return hash((socket.gethostname(), os.getpid())) % 100_000
