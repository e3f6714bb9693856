"""The test double of the GPU worker's handler (a :class:`tuner.gpu.GpuHandler` that measures nothing).

A job's ``tag`` picks a fault, for the worker's own tests:

hang        sleep forever (the parent must time out and kill the process)
crash       os._exit(11), as a segfaulting driver would
cuda_error  raise FakeCudaError, which is_fatal() calls fatal (the child exits after reporting it)
error       raise ValueError, not fatal: the same process keeps serving

Any other tag measures "ok": latency 1 ms and the stand-in figure of the job's config
(:func:`tests.fakes.standin_tuner.standin_tflops`), after 20 ms. ``FLASHTUNE_STANDIN_MIXED=1``
in the environment makes device 1 report another GPU model. :class:`FailingSetup` and
:class:`ExitingSetup` are workers that cannot start.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection

from tuner.gpu import PEER_NAMES, MeasureJob, MeasureResult, MeasureSettings
from tuner.problem import Problem

from .standin_tuner import standin_tflops

__all__ = ["ExitingSetup", "FailingSetup", "FakeCudaError", "FakeGpu"]


class FakeCudaError(RuntimeError):
    pass


class FakeGpu:
    """A CPU stand-in for :class:`tuner.gpu.CupyHandler`, with faults on request and a few calls of its own
    (``pid``, ``jobs_run``, ``echo``) for the worker's tests."""

    def __init__(self) -> None:
        self.device: int | None = None
        self.jobs = 0

    # -- the GpuHandler contract -------------------------------------------------------------------
    def setup(self, device: int) -> None:
        self.device = device

    def is_fatal(self, exc: BaseException) -> bool:
        return isinstance(exc, FakeCudaError)

    def device_info(self) -> dict[str, object]:
        mixed = os.environ.get("FLASHTUNE_STANDIN_MIXED") == "1" and self.device == 1
        return {
            "name": "Other GPU" if mixed else "Stand-in GPU",
            "arch": 80,
            "num_sms": 108,
            "smem_per_block_optin": 166912,
            "regs_per_sm": 65536,
            "driver": "0.0",
            "index": self.device,
        }

    def device_count(self) -> int:
        return 2

    def prepare(self, problem: Problem, settings: MeasureSettings) -> float:
        return 0.0

    def run_job(self, job: MeasureJob) -> MeasureResult:
        self.jobs += 1
        if job.tag == "hang":
            while True:
                time.sleep(60)
        if job.tag == "crash":
            os._exit(11)
        if job.tag == "cuda_error":
            raise FakeCudaError("an illegal memory access was encountered")
        if job.tag == "error":
            raise ValueError("handler refused the job")
        time.sleep(0.02)
        return MeasureResult(status="ok", latency_ms=1.0, tflops=standin_tflops(job.config), reps=1, spread=0.0)

    def run_peers(
        self, problem: Problem, settings: MeasureSettings | None, names: Collection[str] | None = None
    ) -> list[dict[str, object]]:
        """Peers with fixed figures: cuDNN 150, FA2 100, efficient refusing, the GEMM 300 TFLOPS (those of
        ``names``, default all, in PEER_NAMES' order; another name is refused as the real handler refuses it)."""
        rows = [
            {"name": "sdpa_flash_attention", "latency_ms": 1.0, "tflops": 100.0, "detail": ""},
            {"name": "sdpa_cudnn_attention", "latency_ms": 1.0, "tflops": 150.0, "detail": ""},
            {"name": "sdpa_efficient_attention", "latency_ms": None, "tflops": None, "detail": "refused"},
            {"name": "cublas_gemm_8192", "latency_ms": 1.0, "tflops": 300.0, "detail": "random inputs"},
        ]
        assert [r["name"] for r in rows] == list(PEER_NAMES)
        unknown = set(names or ()) - set(PEER_NAMES)
        if unknown:
            raise ValueError(f"unknown peers {sorted(unknown)}")
        return [r for r in rows if names is None or r["name"] in names]

    # -- calls of the worker's tests ---------------------------------------------------------------
    def pid(self) -> int:
        return os.getpid()

    def jobs_run(self) -> int:
        return self.jobs

    def echo(self, argument: object) -> object:
        return argument


class FailingSetup(FakeGpu):
    """A handler whose setup fails, as CupyHandler's does on a machine without a GPU."""

    def setup(self, device: int) -> None:
        raise RuntimeError(f"no CUDA-capable device {device} is detected")


class ExitingSetup(FakeGpu):
    """A handler whose setup kills the process before it can report (a broken driver install)."""

    def setup(self, device: int) -> None:
        os._exit(7)
