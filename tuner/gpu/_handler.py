"""What the GPU worker process serves: the :class:`GpuHandler` contract and its CuPy implementation.

:class:`tuner.run.Worker` is given a handler *class*; its child process makes one instance,
calls :meth:`~GpuHandler.setup` once, then serves the worker's calls on it. The class travels
to the child pickled by reference (its module and qualified name), so it must be defined at the
top level of an importable module. Tests substitute a double (tests/fakes/fake_gpu.py).

This module imports no CuPy: :class:`CupyHandler` imports its GPU modules when the child calls
it, so the tuner's own process can name it without CuPy (or a GPU).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Collection

    from ..problem import Problem
    from ._jobs import MeasureJob, MeasureResult, MeasureSettings

__all__ = ["CupyHandler", "GpuHandler"]


@runtime_checkable
class GpuHandler(Protocol):
    """The calls a GPU worker process serves, on one device, one call at a time.

    Whatever a method raises is reported to the parent as a :class:`tuner.run.WorkerError`; when
    :meth:`is_fatal` calls the exception fatal, the process exits after reporting it (the next call
    gets a fresh process). Arguments and results cross a pipe: they must be picklable.
    """

    def setup(self, device: int) -> None:
        """Make ``device`` this process's device, before any other call (a failure: no worker)."""

    def is_fatal(self, exc: BaseException) -> bool:
        """Whether ``exc`` leaves the process unusable (a sticky CUDA error): it then exits."""

    def device_info(self) -> dict[str, object]:
        """Name, limits, driver and clocks of the device (what :class:`tuner.devices.DeviceLimits` reads)."""

    def device_count(self) -> int:
        """How many GPUs this process can see."""

    def prepare(self, problem: Problem, settings: MeasureSettings) -> float:
        """Get ready for ``problem``'s jobs (inputs, reference, warm-up) before the first; returns its ms."""

    def run_job(self, job: MeasureJob) -> MeasureResult:
        """Check and time one compiled kernel."""

    def run_peers(
        self, problem: Problem, settings: MeasureSettings | None, names: Collection[str] | None = None
    ) -> list[dict[str, object]]:
        """Time the peers (PyTorch SDPA backends, a cuBLAS GEMM; those of ``names``, default all) on ``problem``:
        a row each, in the order of ``tuner.gpu.PEER_NAMES``."""


class CupyHandler:
    """The handler on a real GPU: CuPy launches, a float32 reference check, event timing
    (:mod:`._measure`, :mod:`._timing`, :mod:`._peers`)."""

    def setup(self, device: int) -> None:
        import cupy

        cupy.cuda.Device(device).use()
        cupy.cuda.runtime.free(cupy.cuda.runtime.malloc(1))  # create the context now, not in the first job

    def is_fatal(self, exc: BaseException) -> bool:
        """CUDA errors can leave the context unusable (illegal address, launch failure): start afresh."""
        from cupy_backends.cuda.api import driver, runtime

        return isinstance(exc, (driver.CUDADriverError, runtime.CUDARuntimeError))

    def device_info(self) -> dict[str, object]:
        from ._info import gpu_info

        return gpu_info()

    def device_count(self) -> int:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()

    def prepare(self, problem: Problem, settings: MeasureSettings) -> float:
        from ._measure import prepare

        return prepare(problem, settings)

    def run_job(self, job: MeasureJob) -> MeasureResult:
        from ._measure import run_job

        return run_job(job)

    def run_peers(
        self, problem: Problem, settings: MeasureSettings | None, names: Collection[str] | None = None
    ) -> list[dict[str, object]]:
        from ._peers import time_peers

        return time_peers(problem, settings, names)
