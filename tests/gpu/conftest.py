"""GPU tests: run on a machine with an NVIDIA GPU and CuPy; skipped with the reason elsewhere.

Each module's run time (its tests, with the fixtures they set up and tear down) is printed at the
end of the run and, when ``$FLASHTUNE_TEST_LOG`` names a file, appended there as JSON lines.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import functools
import json
import multiprocessing as mp
import os
import time
from datetime import UTC, datetime

import pytest

from tuner.compile import compile_outcome
from tuner.devices import DeviceLimits

_HERE = os.path.dirname(os.path.abspath(__file__))
_module_seconds: dict[str, float] = collections.defaultdict(float)
_module_tests: dict[str, int] = collections.defaultdict(int)


@functools.cache
def no_gpu_reason() -> str | None:
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Add each test's setup, call and teardown (so the module and session fixtures it starts or ends) to its module."""
    start = time.perf_counter()
    yield
    if no_gpu_reason() is None and str(item.path).startswith(_HERE):
        _module_seconds[item.path.name] += time.perf_counter() - start
        _module_tests[item.path.name] += 1


def pytest_terminal_summary(terminalreporter):
    if not _module_seconds:
        return
    terminalreporter.section("GPU tests: seconds by module")
    total = sum(_module_seconds.values())
    for name, seconds in _module_seconds.items():
        terminalreporter.write_line(f"{seconds:8.1f} s  {name} ({_module_tests[name]} tests)")
    terminalreporter.write_line(f"{total:8.1f} s  in all")
    log = os.environ.get("FLASHTUNE_TEST_LOG")
    if log:
        date = datetime.now(UTC).isoformat(timespec="seconds")
        with open(log, "a", encoding="utf-8") as f:
            for name, seconds in _module_seconds.items():
                f.write(
                    json.dumps(
                        {
                            "date": date,
                            "module": f"tests/gpu/{name}",
                            "seconds": round(seconds, 2),
                            "tests": _module_tests[name],
                        }
                    )
                    + "\n"
                )


@pytest.fixture(scope="session")
def worker():
    from tuner.run import Worker

    with Worker(device=0) as w:
        yield w


@pytest.fixture(scope="session")
def gpu(worker) -> dict:
    return worker.device_info()


@pytest.fixture(scope="session")
def device(gpu) -> DeviceLimits:
    return DeviceLimits.from_info(gpu)


def compile_workers() -> int:
    """One compile process per core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def compile_many(jobs: list[tuple[object, dict, object]], device: DeviceLimits) -> list:
    """Compile (space, config, problem) triples, of any spaces, in one pool sized to the cores;
    returns CompileOutcomes in order."""
    if not jobs:
        return []
    workers = min(compile_workers(), len(jobs))
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        futures = [
            pool.submit(compile_outcome, str(space.path), config, problem, device) for space, config, problem in jobs
        ]
        return [f.result() for f in futures]


def compile_all(space, jobs: list[tuple[dict, object]], device: DeviceLimits) -> list:
    """Compile (config, problem) pairs of one space in parallel; returns CompileOutcomes in order."""
    return compile_many([(space, config, problem) for config, problem in jobs], device)
