"""TODO tuner.run."""

from ._loop import TuneSettings, default_compile_workers, tune
from ._progress import Progress
from ._replay import ReplayError, format_table, load_oracle, replay, replay_one, summarize
from ._retime import retime_top, within_noise_of_best
from ._run import RunSpec, compile_processes, gpu_infos, open_gpus, prepare_study, retime_winner, run_on_gpus, spec_from_study, tune_suite, warm_start_configs
from ._synthetic import additive, feasible_configs, landscapes, main, planted
from ._threads import COMPILE_NICENESS, compile_pool
from ._worker import Worker, WorkerCrashed, WorkerError, WorkerTimeout, WorkerUnavailable

__all__ = ['COMPILE_NICENESS', 'Progress', 'ReplayError', 'RunSpec', 'TuneSettings', 'Worker', 'WorkerCrashed', 'WorkerError', 'WorkerTimeout', 'WorkerUnavailable', 'additive', 'compile_pool', 'compile_processes', 'default_compile_workers', 'feasible_configs', 'format_table', 'gpu_infos', 'landscapes', 'load_oracle', 'main', 'open_gpus', 'planted', 'prepare_study', 'replay', 'replay_one', 'retime_top', 'retime_winner', 'run_on_gpus', 'spec_from_study', 'summarize', 'tune', 'tune_suite', 'warm_start_configs', 'within_noise_of_best']
