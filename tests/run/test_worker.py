"""tuner.worker: the measuring process, with fake handlers (tests/fakes) instead of a GPU."""

from __future__ import annotations

import time

import pytest

from tuner.gpu import MeasureJob, MeasureResult
from tuner.problem import Problem
from tuner.run import Worker, WorkerCrashed, WorkerError, WorkerTimeout, WorkerUnavailable

HANDLER = "tests.fakes.fake_gpu"


def job(tag: str) -> MeasureJob:
    return MeasureJob(cubin_path="/nonexistent.cubin", entry="flashtune_fwd", abi="flat", grid=(1, 1, 1), threads=128,
                      smem_bytes=0, problem=Problem(batch=1, seqlen_q=64, heads_q=1, head_dim=64),
                      config={"block_m": 64}, tag=tag)


@pytest.fixture
def worker():
    w = Worker(handler=HANDLER, device=3, startup_timeout_s=60)
    yield w
    w.close()


def test_ok_result(worker):
    result = worker.measure(job("ok"), timeout_s=30)
    assert isinstance(result, MeasureResult)
    assert result.ok and result.tflops == 123.0 and result.latency_ms == 1.5
    assert worker.call("device_info")["index"] == 3  # setup(device) ran in the child
    assert worker.restarts == 0


def test_calls_share_one_process(worker):
    pid = worker.call("pid")
    for _ in range(3):
        assert worker.measure(job("ok")).ok
    assert worker.call("pid") == pid
    assert worker.call("jobs_run") == 3
    assert worker.call("echo", {"a": [1, 2]}) == {"a": [1, 2]}


def test_hang_times_out_and_next_call_gets_a_new_process(worker):
    first_pid = worker.call("pid")
    start = time.monotonic()
    result = worker.measure(job("hang"), timeout_s=1.5)
    elapsed = time.monotonic() - start
    assert result.status == "timeout"
    assert "1.5" in result.detail or "2 s" in result.detail or "within" in result.detail
    assert 1.4 <= elapsed < 12
    assert worker.measure(job("ok"), timeout_s=30).ok
    assert worker.call("pid") != first_pid
    assert worker.restarts == 1


def test_call_raises_worker_timeout(worker):
    with pytest.raises(WorkerTimeout):
        worker.call("run_job", job("hang"), timeout_s=1)
    assert worker.call("jobs_run") == 0  # a fresh process


def test_crash_is_reported_and_recovered(worker):
    first_pid = worker.call("pid")
    result = worker.measure(job("crash"), timeout_s=30)
    assert result.status == "crashed"
    assert "11" in result.detail  # the exit code
    assert worker.measure(job("ok"), timeout_s=30).ok
    assert worker.call("pid") != first_pid
    assert worker.restarts == 1


def test_call_raises_worker_crashed(worker):
    with pytest.raises(WorkerCrashed):
        worker.call("run_job", job("crash"))


def test_fatal_error_is_a_launch_error_and_the_process_is_replaced(worker):
    first_pid = worker.call("pid")
    result = worker.measure(job("cuda_error"), timeout_s=30)
    assert result.status == "launch_error"
    assert "FakeCudaError" in result.detail and "illegal memory access" in result.detail
    assert worker.measure(job("ok"), timeout_s=30).ok
    assert worker.call("pid") != first_pid
    assert worker.restarts == 1


def test_non_fatal_error_keeps_the_same_process(worker):
    first_pid = worker.call("pid")
    start = time.monotonic()
    result = worker.measure(job("error"), timeout_s=30)
    assert time.monotonic() - start < 1.5  # answered at once: no wait for an exit that does not come
    assert result.status == "launch_error"
    assert "ValueError: handler refused the job" in result.detail
    with pytest.raises(WorkerError, match="handler refused") as info:
        worker.call("run_job", job("error"))
    assert not isinstance(info.value, (WorkerTimeout, WorkerCrashed))
    assert worker.call("pid") == first_pid
    assert worker.call("jobs_run") == 2
    assert worker.restarts == 0


def test_unknown_function_is_a_worker_error(worker):
    with pytest.raises(WorkerError, match="no_such_function"):
        worker.call("no_such_function")
    assert worker.call("echo", 5) == 5


def test_setup_failure_raises_worker_error_at_start():
    w = Worker(handler="tests.fakes.fake_gpu_bad_setup", startup_timeout_s=60)
    try:
        with pytest.raises(WorkerUnavailable, match="no CUDA-capable device 0"):
            w.call("run_job", job("ok"))
        with pytest.raises(WorkerUnavailable, match="no CUDA-capable device 0"):  # not the job's fault: no result
            w.measure(job("ok"))
    finally:
        w.close()


def test_unimportable_handler_raises_worker_error():
    w = Worker(handler="tests.fakes.no_such_module", startup_timeout_s=60)
    try:
        with pytest.raises(WorkerError, match="No module named"):
            w.call("pid")
    finally:
        w.close()


def test_handler_that_dies_while_starting_raises_worker_crashed():
    w = Worker(handler="tests.fakes.fake_gpu_exit_setup", startup_timeout_s=60)
    try:
        with pytest.raises(WorkerUnavailable, match="died while starting.*exit code 7"):
            w.call("pid")
    finally:
        w.close()


def test_close_stops_the_process_and_a_later_call_restarts():
    import os

    with Worker(handler=HANDLER, startup_timeout_s=60) as w:
        pid = w.call("pid")
        process = w._child.process
    assert not process.is_alive()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    try:
        assert w.call("pid") != pid
    finally:
        w.close()


def test_calls_from_several_threads_take_turns():
    """A GPU's measuring lane may still be preparing when the tuner re-times on the same worker."""
    import concurrent.futures as cf

    from tuner.gpu import MeasureJob, MeasureSettings
    from tuner.problem import Problem

    job = MeasureJob(cubin_path="", entry="", abi="", grid=(1, 1, 1), threads=1, smem_bytes=0,
                     problem=Problem(batch=1, seqlen_q=128, heads_q=1, head_dim=64),
                     config={"block_m": 64, "block_n": 64, "stages": 2, "flag": 0}, abi_params={},
                     settings=MeasureSettings(), tag="t")
    with Worker(handler="tests.fakes.standin_gpu") as worker, cf.ThreadPoolExecutor(8) as pool:
        calls = [pool.submit(worker.call, "device_info") if i % 2 else pool.submit(worker.measure, job)
                 for i in range(80)]
        results = [f.result() for f in calls]
    assert all(isinstance(r, dict) for r in results[1::2])
    assert all(isinstance(r, MeasureResult) and r.status == "ok" for r in results[0::2])
