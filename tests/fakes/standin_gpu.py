"""A GPU worker handler that measures nothing: a CPU stand-in for tuner.gpu.measure.

``FLASHTUNE_STANDIN_MIXED=1`` makes device 1 report another GPU model.
"""

from __future__ import annotations

import os
import time

from tuner.gpu import MeasureJob, MeasureResult

from .standin_tuner import standin_tflops

_device = {"index": 0}


def setup(device: int) -> None:
    _device["index"] = device


def device_info(_: object = None) -> dict[str, object]:
    mixed = os.environ.get("FLASHTUNE_STANDIN_MIXED") == "1" and _device["index"] == 1
    return {"name": "Other GPU" if mixed else "Stand-in GPU", "arch": 80, "num_sms": 108,
            "smem_per_block_optin": 166912, "regs_per_sm": 65536, "driver": "0.0", "index": _device["index"]}


def run_job(job: MeasureJob) -> MeasureResult:
    time.sleep(0.02)
    return MeasureResult(status="ok", latency_ms=1.0, tflops=standin_tflops(job.config), reps=1, spread=0.0)


def run_peers(argument: tuple) -> list[dict[str, object]]:
    """Peers with fixed figures: cuDNN 150, FA2 100, efficient refusing, the GEMM 300 TFLOPS."""
    return [{"name": "sdpa_flash_attention", "latency_ms": 1.0, "tflops": 100.0, "detail": ""},
            {"name": "sdpa_cudnn_attention", "latency_ms": 1.0, "tflops": 150.0, "detail": ""},
            {"name": "sdpa_efficient_attention", "latency_ms": None, "tflops": None, "detail": "refused"},
            {"name": "cublas_gemm_8192", "latency_ms": 1.0, "tflops": 300.0, "detail": "random inputs"}]
