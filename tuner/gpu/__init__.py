"""Checking and timing kernels on a GPU through CuPy, and launching them.

Here: the messages between the tuner and its GPU worker process (:class:`MeasureJob`,
:class:`MeasureResult`, :class:`MeasureSettings`, :data:`TOLERANCES`), the contract of what
that process serves (:class:`GpuHandler`) and its CuPy implementation (:class:`CupyHandler`:
inputs and a float32 reference, the correctness check, adaptive event timing, the PyTorch and
cuBLAS peers), and the kernel launch layer (:class:`Kernel`, :class:`Launcher`: a cubin loaded,
its arguments laid out per ABI, TMA tensor maps) with :func:`gpu_info`.

Not here: the worker process itself (:mod:`tuner.run`, which runs a handler in a child process
with timeouts and respawns), compiling (:mod:`tuner.compile`), and two users of the GPU in the
caller's own process: :mod:`tuner.serve`, which launches tuned kernels through this package's
:class:`Kernel` in the process that calls it, and ``flashtune bench --api`` (:mod:`tuner.bench`),
which times the PyTorch entry point through PyTorch's CUDA in the CLI process.

This package imports without CuPy: the launch names (:class:`Kernel`, :class:`Launcher`,
:class:`LaunchError`, :func:`gpu_info`) are loaded, with CuPy, when first asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._handler import CupyHandler, GpuHandler
from ._jobs import (
    GEMM_COOLDOWN_S,
    GEMM_PEER,
    PEER_NAMES,
    TOLERANCES,
    MeasureJob,
    MeasureResult,
    MeasureSettings,
    Status,
    measure_job_for,
)

if TYPE_CHECKING:
    from ._info import gpu_info
    from ._launch import Kernel, Launcher, LaunchError

__all__ = [
    "GEMM_COOLDOWN_S",
    "GEMM_PEER",
    "PEER_NAMES",
    "TOLERANCES",
    "CupyHandler",
    "GpuHandler",
    "Kernel",
    "LaunchError",
    "Launcher",
    "MeasureJob",
    "MeasureResult",
    "MeasureSettings",
    "Status",
    "gpu_info",
    "measure_job_for",
]


def __getattr__(name: str) -> Any:
    """The launch names, imported (with CuPy) when first asked for (PEP 562)."""
    if name in ("Kernel", "Launcher", "LaunchError"):
        from . import _launch

        value = getattr(_launch, name)
    elif name == "gpu_info":
        from ._info import gpu_info as value
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # asked once: later lookups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
