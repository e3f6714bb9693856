"""tuner.run.Worker: the measuring process, with the fake handler (tests/fakes/fake_gpu.py) instead of a GPU."""

from __future__ import annotations

import pickle
import sys
import time
import types

import pytest

from tests.fakes.fake_gpu import ExitingSetup, FailingSetup, FakeGpu
from tests.fakes.standin_tuner import standin_tflops
from tuner.gpu import CupyHandler, GpuHandler, MeasureJob, MeasureResult, MeasureSettings
from tuner.problem import Problem
from tuner.run import Worker, WorkerCrashed, WorkerError, WorkerTimeout, WorkerUnavailable

HANDLER = FakeGpu


def job(tag: str) -> MeasureJob:
    return MeasureJob(
        cubin_path="/nonexistent.cubin",
        entry="flashtune_fwd",
        abi="flat",
        grid=(1, 1, 1),
        threads=128,
        smem_bytes=0,
        problem=Problem(batch=1, seqlen_q=64, heads_q=1, head_dim=64),
        config={"block_m": 64},
        tag=tag,
    )


@pytest.fixture
def worker():
    w = Worker(handler=HANDLER, device=3, startup_timeout_s=60)
    yield w
    w.close()


def test_ok_result(worker):
    result = worker.measure(job("ok"), timeout_s=30)
    assert isinstance(result, MeasureResult)
    assert result.ok and result.tflops == standin_tflops(job("ok").config) and result.latency_ms == 1.0
    assert worker.device_info()["index"] == 3  # setup(device) ran in the child
    assert worker.restarts == 0


def test_calls_share_one_process(worker):
    pid = worker.call(FakeGpu.pid)
    for _ in range(3):
        assert worker.measure(job("ok")).ok
    assert worker.call(FakeGpu.pid) == pid
    assert worker.call(FakeGpu.jobs_run) == 3
    assert worker.call(FakeGpu.echo, {"a": [1, 2]}) == {"a": [1, 2]}


def test_hang_times_out_and_next_call_gets_a_new_process(worker):
    first_pid = worker.call(FakeGpu.pid)
    start = time.monotonic()
    result = worker.measure(job("hang"), timeout_s=1.5)
    elapsed = time.monotonic() - start
    assert result.status == "timeout"
    assert "1.5" in result.detail or "2 s" in result.detail or "within" in result.detail
    assert 1.4 <= elapsed < 12
    assert worker.measure(job("ok"), timeout_s=30).ok
    assert worker.call(FakeGpu.pid) != first_pid
    assert worker.restarts == 1


def test_call_raises_worker_timeout(worker):
    with pytest.raises(WorkerTimeout):
        worker.call(FakeGpu.run_job, job("hang"), timeout_s=1)
    assert worker.call(FakeGpu.jobs_run) == 0  # a fresh process


def test_crash_is_reported_and_recovered(worker):
    first_pid = worker.call(FakeGpu.pid)
    result = worker.measure(job("crash"), timeout_s=30)
    assert result.status == "crashed"
    assert "11" in result.detail  # the exit code
    assert worker.measure(job("ok"), timeout_s=30).ok
    assert worker.call(FakeGpu.pid) != first_pid
    assert worker.restarts == 1


def test_call_raises_worker_crashed(worker):
    with pytest.raises(WorkerCrashed):
        worker.call(FakeGpu.run_job, job("crash"))


def test_fatal_error_is_a_launch_error_and_the_process_is_replaced(worker):
    first_pid = worker.call(FakeGpu.pid)
    result = worker.measure(job("cuda_error"), timeout_s=30)
    assert result.status == "launch_error"
    assert "FakeCudaError" in result.detail and "illegal memory access" in result.detail
    assert worker.measure(job("ok"), timeout_s=30).ok
    assert worker.call(FakeGpu.pid) != first_pid
    assert worker.restarts == 1


def test_non_fatal_error_keeps_the_same_process(worker):
    first_pid = worker.call(FakeGpu.pid)
    start = time.monotonic()
    result = worker.measure(job("error"), timeout_s=30)
    assert time.monotonic() - start < 1.5  # answered at once: no wait for an exit that does not come
    assert result.status == "launch_error"
    assert "ValueError: handler refused the job" in result.detail
    with pytest.raises(WorkerError, match="handler refused") as info:
        worker.call(FakeGpu.run_job, job("error"))
    assert not isinstance(info.value, (WorkerTimeout, WorkerCrashed))
    assert worker.call(FakeGpu.pid) == first_pid
    assert worker.call(FakeGpu.jobs_run) == 2
    assert worker.restarts == 0


def no_such_function(handler: FakeGpu) -> object:
    """A call of a method the handler does not have."""
    return handler.no_such_function()  # type: ignore[attr-defined]


def test_unknown_function_is_a_worker_error(worker):
    with pytest.raises(WorkerError, match="no_such_function"):
        worker.call(no_such_function)
    assert worker.call(FakeGpu.echo, 5) == 5


def test_setup_failure_raises_worker_error_at_start():
    w = Worker(handler=FailingSetup, startup_timeout_s=60)
    try:
        with pytest.raises(WorkerUnavailable, match="no CUDA-capable device 0"):
            w.call(FakeGpu.run_job, job("ok"))
        with pytest.raises(WorkerUnavailable, match="no CUDA-capable device 0"):  # not the job's fault: no result
            w.measure(job("ok"))
    finally:
        w.close()


def _only_here(monkeypatch, name: str, value: object) -> object:
    """``value`` (a class or function) as an attribute of a module that exists in this process only: it pickles
    here, and the worker process cannot import it."""
    module = types.ModuleType("tests.fakes.no_such_module")
    value.__module__, value.__qualname__ = module.__name__, name
    setattr(module, name, value)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return value


def test_unimportable_handler_raises_worker_error(monkeypatch):
    handler = _only_here(monkeypatch, "Elsewhere", type("Elsewhere", (FakeGpu,), {}))
    w = Worker(handler=handler, startup_timeout_s=60)
    try:
        with pytest.raises(WorkerError, match="No module named"):
            w.call(FakeGpu.pid)
    finally:
        w.close()


def test_a_call_the_worker_cannot_import_is_a_worker_error_and_the_worker_goes_on(worker, monkeypatch):
    def elsewhere(handler):
        return "never"

    pid = worker.call(FakeGpu.pid)
    with pytest.raises(WorkerError, match="No module named"):
        worker.call(_only_here(monkeypatch, "elsewhere", elsewhere))
    assert worker.call(FakeGpu.pid) == pid and worker.restarts == 0


def test_a_handler_is_a_class_the_worker_process_can_import():
    with pytest.raises(TypeError, match="must be a class"):
        Worker(handler="tests.fakes.fake_gpu")  # type: ignore[arg-type]

    class Local(FakeGpu):
        pass

    with pytest.raises(TypeError, match="top level of a module"):
        Worker(handler=Local)
    assert Worker().handler is CupyHandler  # the default, started only by a call
    assert pickle.loads(pickle.dumps(FakeGpu)) is FakeGpu


@pytest.mark.parametrize("handler", [CupyHandler, FakeGpu, FailingSetup, ExitingSetup])
def test_the_handlers_follow_the_contract(handler):
    assert issubclass(handler, GpuHandler)
    for name in ("setup", "is_fatal", "device_info", "device_count", "prepare", "run_job", "run_peers"):
        assert callable(getattr(handler, name)), name


def test_the_typed_calls_reach_the_handler(worker):
    problem = Problem(batch=1, seqlen_q=64, heads_q=1, head_dim=64)
    assert worker.device_info()["name"] == "Stand-in GPU"
    assert worker.device_count() == 2
    assert worker.prepare(problem, MeasureSettings()) == 0.0
    assert [r["name"] for r in worker.peers(problem, MeasureSettings())][-1] == "cublas_gemm_8192"
    with pytest.raises(WorkerTimeout, match="run_job did not finish within 1 s"):
        worker.call(FakeGpu.run_job, job("hang"), timeout_s=1)


def test_handler_that_dies_while_starting_raises_worker_crashed():
    w = Worker(handler=ExitingSetup, startup_timeout_s=60)
    try:
        with pytest.raises(WorkerUnavailable, match=r"died while starting.*exit code 7"):
            w.call(FakeGpu.pid)
    finally:
        w.close()


def test_close_stops_the_process_and_a_later_call_restarts():
    import os

    with Worker(handler=HANDLER, startup_timeout_s=60) as w:
        pid = w.call(FakeGpu.pid)
        process = w._child.process
    assert not process.is_alive()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    try:
        assert w.call(FakeGpu.pid) != pid
    finally:
        w.close()


def test_calls_from_several_threads_take_turns():
    """A GPU's measuring lane may still be preparing when the tuner re-times on the same worker."""
    import concurrent.futures as cf

    from tuner.gpu import MeasureJob, MeasureSettings
    from tuner.problem import Problem

    job = MeasureJob(
        cubin_path="",
        entry="",
        abi="",
        grid=(1, 1, 1),
        threads=1,
        smem_bytes=0,
        problem=Problem(batch=1, seqlen_q=128, heads_q=1, head_dim=64),
        config={"block_m": 64, "block_n": 64, "stages": 2, "flag": 0},
        abi_params={},
        settings=MeasureSettings(),
        tag="t",
    )
    with Worker(handler=FakeGpu) as worker, cf.ThreadPoolExecutor(8) as pool:
        calls = [pool.submit(worker.device_info) if i % 2 else pool.submit(worker.measure, job) for i in range(80)]
        results = [f.result() for f in calls]
    assert all(isinstance(r, dict) for r in results[1::2])
    assert all(isinstance(r, MeasureResult) and r.status == "ok" for r in results[0::2])


def test_the_worker_and_its_default_handler_are_named_without_cupy():
    """The tuner's process starts workers on machines where only the child has a GPU (and CI has no CuPy)."""
    import subprocess

    code = (
        "import sys; sys.modules['cupy'] = None; sys.modules['cupy_backends'] = None\n"
        "import tuner.gpu as gpu\n"
        "from tuner.run import Worker\n"
        "assert Worker().handler is gpu.CupyHandler and 'Kernel' in gpu.__all__\n"
        "try:\n"
        "    gpu.Kernel\n"
        "except ImportError as e:\n"
        "    assert 'cupy' in str(e), e\n"
        "else:\n"
        "    raise AssertionError('tuner.gpu.Kernel needs CuPy: loaded when first asked for')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
