"""TODO tuner.compile."""

from ._check import CheckReport, CheckRow, MAX_JOBS, all_configs, check_space
from ._nvcc import CompileError, CompileOutcome, CompiledKernel, cache_dir, compile_config, compile_outcome, nvcc_options
from ._ptxas import Resources, parse_ptxas

__all__ = ['CheckReport', 'CheckRow', 'CompileError', 'CompileOutcome', 'CompiledKernel', 'MAX_JOBS', 'Resources', 'all_configs', 'cache_dir', 'check_space', 'compile_config', 'compile_outcome', 'nvcc_options', 'parse_ptxas']
