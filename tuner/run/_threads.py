"""What runs beside the tuning loop's thread: the compile pool, one measuring lane per GPU, the
storing thread. The loop proposes, creates and stores trials while GPUs measure and CPUs compile.

With ``compile_workers = 0`` (replay, tests) everything runs in the loop's thread, in order, so
that a seeded run is repeatable.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import functools
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from ..gpu import MeasureJob, MeasureResult, MeasureSettings
from ..problem import Problem
from ._contracts import Measure

__all__ = ["COMPILE_NICENESS", "GpuLane", "Storer", "close_pool", "compile_pool", "ignore_stop_signals"]

COMPILE_NICENESS = 10  # added to the compile processes' niceness


class _InlineExecutor(cf.Executor):
    """Runs each call at once in the calling thread (``compile_workers = 0``: replay, where compiling is a lookup)."""

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
        future: cf.Future = cf.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:
            future.set_exception(e)
        return future


def compile_pool(workers: int) -> cf.Executor:
    """``workers`` spawned processes (0: compile in this thread), at a lower CPU priority than the tuner and
    its GPU workers (with every core compiling, a GPU worker that waits for a core holds up the GPU); each
    exits when the tuner that started it is gone, even killed with SIGKILL."""
    if workers == 0:
        return _InlineExecutor()
    return cf.ProcessPoolExecutor(
        max_workers=workers,
        mp_context=mp.get_context("spawn"),
        initializer=_compile_process_setup,
        initargs=(os.getpid(),),
    )


def close_pool(pool: cf.Executor) -> None:
    """Cancel the compiles not yet started and wait for those in flight (a stopped run's are ignored) and for
    the pool's manager thread. Exit would wait for them anyway; waiting here keeps the manager thread from
    closing its wake-up pipe while CPython 3.11's exit hook writes to it, which printed "Exception ignored
    ... Bad file descriptor" after a stop signal had killed the pool's processes."""
    pool.shutdown(wait=True, cancel_futures=True)


def ignore_stop_signals() -> None:
    """In a child process: leave SIGHUP (sent to the whole process group when its terminal closes) to the
    tuner, which stops its children itself once it has stored how it stopped; a child whose tuner is
    gone exits on its own. SIGTERM keeps ending a child at once: it is what a process pool stops its
    processes with."""
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)


def _compile_process_setup(tuner_pid: int) -> None:
    ignore_stop_signals()
    with contextlib.suppress(OSError, AttributeError):  # not permitted, or not a POSIX system: compile as is
        os.nice(COMPILE_NICENESS)
    threading.Thread(target=_exit_when_orphaned, args=(tuner_pid,), name="flashtune-orphan-watch", daemon=True).start()


def _exit_when_orphaned(tuner_pid: int, interval_s: float = 1.0) -> None:
    while os.getppid() == tuner_pid:
        time.sleep(interval_s)
    os._exit(0)  # the pool's manager is gone with the tuner: nobody will collect what this process compiles


class _SerialThread:
    """Runs submitted calls in order on one daemon thread (a daemon: a stopping tuner does not wait for a
    measurement it has given up on); each call's result or exception goes to its future."""

    def __init__(self, name: str) -> None:
        self._calls: queue.Queue[tuple[cf.Future, Callable[[], Any]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._calls.get()) is not None:
            future, call = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except BaseException as e:
                future.set_exception(e)

    def submit(self, call: Callable[[], Any]) -> cf.Future:
        future: cf.Future = cf.Future()
        self._calls.put((future, call))
        return future

    def close(self, *, wait: bool) -> None:
        self._calls.put(None)
        if wait:
            self._thread.join()


class GpuLane:
    """One GPU's measurements, one at a time, on a thread of their own (in the loop's thread when
    ``inline``). :meth:`start` returns a future of (result, seconds the measurement took). The GPU is
    prepared for ``problem`` first (the worker makes the problem's inputs and warms up; see
    :meth:`Measure.prepare <._contracts.Measure.prepare>`); :attr:`prepared` is its future (of its seconds,
    or its error)."""

    def __init__(
        self, gpu: Measure, *, problem: Problem, settings: MeasureSettings, index: int = 0, inline: bool = False
    ) -> None:
        self.gpu = gpu
        self.index = index
        self.busy = False
        self._thread = None if inline else _SerialThread(f"flashtune-gpu-lane-{index}")
        self.prepared: cf.Future = self._run(functools.partial(_seconds, gpu.prepare, problem, settings))

    def _run(self, call: Callable[[], Any]) -> cf.Future:
        return self._thread.submit(call) if self._thread is not None else _InlineExecutor().submit(call)

    def start(self, job: MeasureJob) -> cf.Future:
        self.busy = True
        return self._run(lambda: self._timed(job))

    def _timed(self, job: MeasureJob) -> tuple[MeasureResult, float]:
        t0 = time.monotonic()
        result = self.gpu.measure(job)
        return result, time.monotonic() - t0

    def close(self) -> None:
        if self._thread is not None:
            self._thread.close(wait=False)


def _seconds(call: Callable[..., object], *args: Any) -> float:
    t0 = time.monotonic()
    call(*args)
    return time.monotonic() - t0


class Storer:
    """Runs storage calls in order on one thread, so that storing a measured trial does not hold up the
    GPU. A call that fails (the database is gone past its retries) stops the rest; :meth:`check` and
    :meth:`close` hand its error to the loop."""

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self._thread = _SerialThread("flashtune-store")

    def _guarded(self, call: Callable[[], Any]) -> None:
        if self.error is not None:
            return
        try:
            call()
        except BaseException as e:
            self.error = e

    def submit(self, call: Callable[[], Any]) -> None:
        self.check()
        self._thread.submit(lambda: self._guarded(call))

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def close(self) -> BaseException | None:
        """Run the calls queued so far, end the thread; the first call's error, if any."""
        self._thread.close(wait=True)
        return self.error
