"""Compile one config of a kernel family to a cubin with nvcc (no GPU needed), and check a whole space.

:func:`compile_outcome` is what the tuning loop runs in its compile processes: it never raises, it
returns a :class:`~tuner.outcome.Outcome` whose payload is the :class:`CompiledKernel` (cubin path,
entry, ptxas :class:`Resources`). Built cubins are cached on disk under :func:`cache_dir`, keyed by
every kernel source file, the flags, the arch and the nvcc version. :func:`check_space` (``flashtune
check``) compiles a sample of a space's statically feasible configs and reports errors and spills.
"""

from ._check import MAX_JOBS, CheckReport, CheckRow, all_configs, check_space
from ._nvcc import (
    CompiledKernel,
    CompileError,
    CompileOutcome,
    cache_dir,
    compile_config,
    compile_outcome,
    nvcc_options,
)
from ._ptxas import Resources, parse_ptxas

__all__ = [
    "MAX_JOBS",
    "CheckReport",
    "CheckRow",
    "CompileError",
    "CompileOutcome",
    "CompiledKernel",
    "Resources",
    "all_configs",
    "cache_dir",
    "check_space",
    "compile_config",
    "compile_outcome",
    "nvcc_options",
    "parse_ptxas",
]
