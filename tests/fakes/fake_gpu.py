"""A stand-in for ``tuner.gpu.measure`` in the worker process; behaviour chosen by the job's ``tag``.

ok          return a MeasureResult
hang        sleep forever (the parent must time out and kill the process)
crash       os._exit, as a segfaulting driver would
cuda_error  raise FakeCudaError, which is_fatal() calls fatal (the child exits after reporting it)
error       raise ValueError, not fatal: the same process keeps serving
"""

from __future__ import annotations

import os
import time

from tuner.gpu import MeasureJob, MeasureResult

_state = {"device": None, "jobs": 0}


class FakeCudaError(RuntimeError):
    pass


def setup(device: int) -> None:
    _state["device"] = device


def is_fatal(exc: BaseException) -> bool:
    return isinstance(exc, FakeCudaError)


def device_info(_: object = None) -> dict[str, object]:
    return {"name": "Fake GPU", "arch": 80, "num_sms": 108, "smem_per_block_optin": 166912, "regs_per_sm": 65536,
            "driver": "0.0", "index": _state["device"]}


def pid(_: object = None) -> int:
    return os.getpid()


def jobs_run(_: object = None) -> int:
    return _state["jobs"]


def echo(argument: object) -> object:
    return argument


def run_job(job: MeasureJob) -> MeasureResult:
    _state["jobs"] += 1
    if job.tag == "ok":
        return MeasureResult(status="ok", latency_ms=1.5, tflops=123.0, reps=10, spread=0.01)
    if job.tag == "hang":
        while True:
            time.sleep(60)
    if job.tag == "crash":
        os._exit(11)
    if job.tag == "cuda_error":
        raise FakeCudaError("an illegal memory access was encountered")
    if job.tag == "error":
        raise ValueError("handler refused the job")
    raise AssertionError(f"unknown tag {job.tag!r}")
