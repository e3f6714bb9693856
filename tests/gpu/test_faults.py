"""Fault isolation on a real GPU: a hanging kernel, an illegal address, NaN output. The worker survives each."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tuner.jobs import MeasureJob, MeasureSettings
from tuner.problem import Problem

pytestmark = pytest.mark.gpu

KERNELS = Path(__file__).parent / "kernels"
PROBLEM = Problem(batch=1, seqlen_q=128, heads_q=2, head_dim=128)


def _planted(tmp_path, fault: int, device) -> str:
    from cupy.cuda import compiler

    cubin = compiler.compile_using_nvcc((KERNELS / "faulty.cu").read_text(), options=(f"-DFAULT={fault}",),
                                        arch=str(device.arch))
    path = tmp_path / f"fault{fault}.cubin"
    path.write_bytes(cubin)
    return str(path)


def _job(cubin: str, tag: str) -> MeasureJob:
    return MeasureJob(cubin_path=cubin, entry="flashtune_fwd", abi="flat", grid=(1, 1, 1), threads=128, smem_bytes=0,
                      problem=PROBLEM, config={}, settings=MeasureSettings(timing=False), tag=tag)


def _good_job(device) -> MeasureJob:
    from tuner.compile import compile_config
    from tuner.space import load_space
    from tuner.jobs import measure_job_for

    space = load_space("sm80")
    config = space.defaults()
    kernel = compile_config(space, config, PROBLEM, device)
    return measure_job_for(space, config, PROBLEM, device, kernel, MeasureSettings(min_reps=3, max_reps=5), tag="good")


def test_hanging_kernel_times_out_and_the_worker_recovers(worker, device, tmp_path):
    restarts = worker.restarts
    result = worker.measure(_job(_planted(tmp_path, 1, device), "hang"), timeout_s=20)
    assert result.status == "timeout"
    good = worker.measure(_good_job(device), timeout_s=120)
    assert good.ok, good.detail
    assert worker.restarts == restarts + 1


def test_illegal_address_is_a_launch_error_and_the_worker_recovers(worker, device, tmp_path):
    result = worker.measure(_job(_planted(tmp_path, 2, device), "illegal"), timeout_s=60)
    assert result.status in ("launch_error", "crashed"), result
    assert "illegal" in result.detail.lower() or result.status == "crashed", result.detail
    good = worker.measure(_good_job(device), timeout_s=120)
    assert good.ok and good.tflops and good.tflops > 0 and math.isfinite(good.latency_ms)


def test_nan_output_is_a_wrong_result(worker, device, tmp_path):
    result = worker.measure(_job(_planted(tmp_path, 3, device), "nan"), timeout_s=60)
    assert result.status == "wrong_result"
    assert "not finite" in result.detail
