"""Running a tuning study: the loop that proposes, compiles ahead, measures on the GPUs and stores.

:func:`prepare_study` creates or resumes a study and :func:`run_on_gpus` tunes it on this host's
GPUs, one GPU :class:`Worker` process each (:func:`join_study`: another host joins a study;
:func:`tune_suite`: every problem of a suite file); :func:`retime_winner` re-times the best configs
and stores the winner. Underneath, :func:`tune` runs one :class:`~._loop.TuneLoop` over a study,
calling a :class:`Compile` and one :class:`Measure` per GPU. :func:`replay` runs the same loop
against a stored sweep (or a synthetic landscape, :func:`landscapes`) instead of a GPU, to compare
searches without one.
"""

from ._contracts import Compile, Measure, MeasureFunction
from ._loop import RunStats, TuneSettings, TuneSummary, default_compile_workers, tune
from ._progress import Progress
from ._replay import ReplayError, format_table, load_oracle, replay, replay_one, summarize
from ._retime import (
    CONFIDENCE,
    DEFAULT_NOISE_FLOOR,
    DEFAULT_ROUNDS,
    Comparison,
    compare,
    retime_top,
    within_noise_of_best,
)
from ._run import (
    RunSpec,
    TuningRun,
    compile_processes,
    gpu_infos,
    join_study,
    open_gpus,
    prepare_study,
    retime_winner,
    run_on_gpus,
    tune_suite,
    warm_start_configs,
)
from ._synthetic import additive, feasible_configs, landscapes, planted
from ._threads import COMPILE_NICENESS, compile_pool
from ._worker import Worker, WorkerCrashed, WorkerError, WorkerTimeout, WorkerUnavailable

__all__ = [
    "COMPILE_NICENESS",
    "CONFIDENCE",
    "DEFAULT_NOISE_FLOOR",
    "DEFAULT_ROUNDS",
    "Comparison",
    "Compile",
    "Measure",
    "MeasureFunction",
    "Progress",
    "ReplayError",
    "RunSpec",
    "RunStats",
    "TuneSettings",
    "TuneSummary",
    "TuningRun",
    "Worker",
    "WorkerCrashed",
    "WorkerError",
    "WorkerTimeout",
    "WorkerUnavailable",
    "additive",
    "compare",
    "compile_pool",
    "compile_processes",
    "default_compile_workers",
    "feasible_configs",
    "format_table",
    "gpu_infos",
    "join_study",
    "landscapes",
    "load_oracle",
    "open_gpus",
    "planted",
    "prepare_study",
    "replay",
    "replay_one",
    "retime_top",
    "retime_winner",
    "run_on_gpus",
    "summarize",
    "tune",
    "tune_suite",
    "warm_start_configs",
    "within_noise_of_best",
]
