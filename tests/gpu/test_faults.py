"""Fault isolation on a real GPU: a hanging kernel, an illegal address, NaN output, a kernel that writes
into its inputs. The worker survives each, and no later job is checked on spoilt inputs."""

from __future__ import annotations

import concurrent.futures as cf
import math
from pathlib import Path

import pytest

from tuner.gpu import MeasureJob, MeasureSettings
from tuner.problem import Problem

pytestmark = pytest.mark.gpu

KERNELS = Path(__file__).parent / "kernels"
PROBLEM = Problem(batch=1, seqlen_q=128, heads_q=2, head_dim=128)
FAULTS = {"hang": 1, "illegal": 2, "nan": 3, "writes_inputs": 4}


@pytest.fixture(scope="module")
def planted(device, tmp_path_factory) -> dict[str, str]:
    """The cubin of each planted fault (nvcc runs in parallel)."""
    from cupy.cuda import compiler

    directory = tmp_path_factory.mktemp("faults")
    source = (KERNELS / "faulty.cu").read_text()

    def build(item: tuple[str, int]) -> tuple[str, str]:
        name, fault = item
        path = directory / f"{name}.cubin"
        path.write_bytes(compiler.compile_using_nvcc(source, options=(f"-DFAULT={fault}",), arch=str(device.arch)))
        return name, str(path)

    with cf.ThreadPoolExecutor(len(FAULTS)) as pool:
        return dict(pool.map(build, FAULTS.items()))


def _job(cubin: str, tag: str, settings: MeasureSettings | None = None) -> MeasureJob:
    return MeasureJob(
        cubin_path=cubin,
        entry="flashtune_fwd",
        abi="flat",
        grid=(1, 1, 1),
        threads=128,
        smem_bytes=0,
        problem=PROBLEM,
        config={},
        settings=settings or MeasureSettings(timing=False),
        tag=tag,
    )


@pytest.fixture(scope="module")
def good_job(device) -> MeasureJob:
    from tuner.compile import compile_config
    from tuner.gpu import measure_job_for
    from tuner.space import load_space

    space = load_space("sm80")
    config = space.defaults()
    kernel = compile_config(space, config, PROBLEM, device)
    return measure_job_for(space, config, PROBLEM, device, kernel, MeasureSettings(min_reps=3, max_reps=5), tag="good")


@pytest.fixture
def warm(worker, good_job):
    """A worker that has the problem's inputs already, so a faulty job reaches its launch at once."""
    result = worker.measure(good_job, timeout_s=120)
    assert result.ok, result.detail
    return worker


def test_hanging_kernel_times_out_and_the_worker_recovers(warm, planted, good_job):
    restarts = warm.restarts
    result = warm.measure(_job(planted["hang"], "hang"), timeout_s=10)
    assert result.status == "timeout"
    good = warm.measure(good_job, timeout_s=120)
    assert good.ok, good.detail
    assert warm.restarts == restarts + 1


def test_illegal_address_is_a_launch_error_and_the_worker_recovers(warm, planted, good_job):
    result = warm.measure(_job(planted["illegal"], "illegal"), timeout_s=60)
    assert result.status in ("launch_error", "crashed"), result
    assert "illegal" in result.detail.lower() or result.status == "crashed", result.detail
    good = warm.measure(good_job, timeout_s=120)
    assert good.ok and good.tflops and good.tflops > 0 and math.isfinite(good.latency_ms)


def test_nan_output_is_a_wrong_result(warm, planted):
    result = warm.measure(_job(planted["nan"], "nan"), timeout_s=60)
    assert result.status == "wrong_result"
    assert "not finite" in result.detail


def test_a_kernel_that_writes_into_its_inputs_is_wrong_and_the_inputs_are_made_again(warm, planted, good_job):
    again = warm.measure(good_job, timeout_s=120)
    assert again.ok and again.phases_ms["inputs"] == 0  # served by the kept inputs
    timed_only = MeasureSettings(check=False, min_reps=3, max_reps=3)
    result = warm.measure(_job(planted["writes_inputs"], "writes-inputs", timed_only), timeout_s=60)
    assert result.status == "wrong_result" and "wrote outside its outputs" in result.detail, result
    after = warm.measure(good_job, timeout_s=120)
    assert after.ok, after.detail
    assert after.phases_ms["inputs"] > 0  # the spoilt inputs were dropped, not reused
    checked = warm.measure(_job(planted["writes_inputs"], "writes-inputs-checked"), timeout_s=60)
    assert checked.status == "wrong_result" and "wrote outside its outputs" in checked.detail
    assert "not finite" in checked.detail  # and the NaN it writes
    after = warm.measure(good_job, timeout_s=120)
    assert after.ok and after.phases_ms["inputs"] > 0
