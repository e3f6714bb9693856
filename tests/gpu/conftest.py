"""GPU tests: run on a machine with an NVIDIA GPU and CuPy; skipped with the reason elsewhere."""

from __future__ import annotations

import concurrent.futures as cf
import functools
import multiprocessing as mp

import pytest

from tuner.devices import DeviceLimits
from tuner.compile import compile_outcome


@functools.cache
def no_gpu_reason() -> str | None:
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - any failure means: no usable GPU here
        return f"no usable CUDA GPU ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    return None if count else "no CUDA GPU on this machine"


def pytest_collection_modifyitems(config, items):
    """Skip this folder's tests, with the reason, before any session fixture tries to start a GPU worker."""
    reason = no_gpu_reason()
    here = str(config.rootpath / "tests" / "gpu")
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def worker():
    from tuner.worker import Worker

    with Worker(device=0) as w:
        yield w


@pytest.fixture(scope="session")
def gpu(worker) -> dict:
    return worker.call("device_info")


@pytest.fixture(scope="session")
def device(gpu) -> DeviceLimits:
    return DeviceLimits.from_info(gpu)


def compile_all(space, jobs: list[tuple[dict, object]], device: DeviceLimits) -> list:
    """Compile (config, problem) pairs in parallel; returns CompileOutcomes in order."""
    with cf.ProcessPoolExecutor(max_workers=14, mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(compile_outcome, str(space.path), config, problem, device) for config, problem in jobs]
        return [f.result() for f in futures]
