"""A long-lived measuring process per GPU, isolated from the tuner.

The child makes an instance of the worker's handler class (a :class:`tuner.gpu.GpuHandler`, by
default :class:`tuner.gpu.CupyHandler`), calls its ``setup(device)`` once, then serves calls: a
function and its arguments, run as ``function(handler, *arguments)`` (the typed methods below
send the handler's own methods). The parent enforces a timeout on every call: a hung kernel (a
deadlocked barrier, say) is killed with its process and the next call starts a fresh one; a
child that dies (an illegal address makes a CUDA context unusable, so the child exits on purpose
after the handler's ``is_fatal`` says so) is noticed at once. Either way the caller gets an
answer and the study goes on. The child also exits when its parent disappears.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import threading
import time
import traceback
from collections.abc import Callable, Collection
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any, Self, TypeVar

from ..errors import FlashtuneError
from ..gpu import CupyHandler, GpuHandler, MeasureJob, MeasureResult, MeasureSettings
from ..problem import Problem
from ._threads import ignore_stop_signals

__all__ = ["Worker", "WorkerCrashed", "WorkerError", "WorkerTimeout", "WorkerUnavailable"]


class WorkerError(FlashtuneError, RuntimeError):
    """The handler raised; the message carries its traceback's last line."""


class WorkerTimeout(WorkerError):
    """The call did not answer in time; the worker process was killed."""


class WorkerCrashed(WorkerError):
    """The worker process died during the call."""


class WorkerUnavailable(WorkerError):
    """No worker process could be started (or restarted): the GPU is unusable, not the job at fault.
    :meth:`Worker.measure` raises it instead of blaming the trial in hand."""


@dataclass
class _Child:
    process: Any
    conn: Connection


R = TypeVar("R")


class Worker:
    """Run a GPU handler's calls in a child process; see the module docstring.

    ``handler``: the class the child instantiates (None: :class:`tuner.gpu.CupyHandler`), defined at
    the top level of a module the child can import (it is pickled by reference)."""

    def __init__(
        self, *, handler: type[GpuHandler] | None = None, device: int = 0, startup_timeout_s: float = 180.0
    ) -> None:
        if handler is not None and not isinstance(handler, type):
            raise TypeError(
                f"handler must be a class (a tuner.gpu.GpuHandler, such as tuner.gpu.CupyHandler), not {handler!r}"
            )
        self.handler: type[GpuHandler] = CupyHandler if handler is None else handler
        try:  # by reference: the child imports the class's module
            self._handler_reference = pickle.dumps(self.handler)
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            raise TypeError(
                f"handler {self.handler.__qualname__} cannot be sent to the worker process ({e}); define "
                "it at the top level of a module"
            ) from None
        self.device = device
        self.startup_timeout_s = startup_timeout_s
        self._child: _Child | None = None
        self._started = 0  # processes started so far
        self.restarts = 0  # processes started to replace one that hung, crashed or exited
        self._calling = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------------
    def _ensure(self) -> _Child:
        if self._child is not None and self._child.process.is_alive():
            return self._child
        if self._child is not None:
            self._reap()
        if self._started:
            self.restarts += 1
        ctx = mp.get_context("spawn")
        parent_conn, child_conn = ctx.Pipe()
        process = ctx.Process(
            target=_serve,
            args=(child_conn, self._handler_reference, self.device, os.getpid()),
            name=f"flashtune-worker-{self.device}",
            daemon=True,
        )
        process.start()
        child_conn.close()
        if not parent_conn.poll(self.startup_timeout_s):
            process.kill()
            process.join()
            raise WorkerUnavailable(f"worker for GPU {self.device} did not start within {self.startup_timeout_s:.0f} s")
        try:
            kind, payload = parent_conn.recv()
        except EOFError:
            process.join()
            raise WorkerUnavailable(
                f"worker for GPU {self.device} died while starting (exit code {process.exitcode})"
            ) from None
        if kind != "ready":
            process.join()
            raise WorkerUnavailable(f"worker for GPU {self.device} could not start: {payload}")
        self._child = _Child(process, parent_conn)
        self._started += 1
        return self._child

    def _reap(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        if child.process.is_alive():
            child.process.kill()
        child.process.join(timeout=10)
        child.conn.close()

    def close(self) -> None:
        child = self._child
        if child is not None and child.process.is_alive():
            try:
                child.conn.send_bytes(b"")  # stop
                child.process.join(timeout=5)
            except (OSError, BrokenPipeError):
                pass
        self._reap()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls -----------------------------------------------------------------------------
    def call(self, function: Callable[..., R], *arguments: Any, timeout_s: float = 120.0) -> R:
        """Run ``function(handler, *arguments)`` in the child and return its result: ``function`` is a method
        of the handler's class (``worker.call(FakeGpu.pid)``) or a module-level function, picklable by
        reference. Raises :class:`WorkerTimeout`, :class:`WorkerCrashed` or :class:`WorkerError`. Calls from
        several threads (a GPU's measuring lane and the re-timing after it) take turns: one call at a time
        is on the pipe."""
        with self._calling:
            return self._call(function, arguments, timeout_s)

    def _call(self, function: Callable[..., R], arguments: tuple, timeout_s: float) -> R:
        name = function.__name__
        child = self._ensure()
        child.conn.send((function, arguments))
        if not child.conn.poll(timeout_s):
            self._reap()
            raise WorkerTimeout(f"{name} did not finish within {timeout_s:.0f} s; the worker was killed")
        try:
            kind, payload = child.conn.recv()
        except (EOFError, ConnectionResetError):
            child.process.join(timeout=10)
            code = child.process.exitcode
            self._reap()
            raise WorkerCrashed(f"worker died during {name} (exit code {code})") from None
        if kind == "fatal":  # the child exits after a fatal error: do not wait for it
            self._reap()
        if kind in ("error", "fatal"):
            raise WorkerError(payload)
        return payload

    def device_info(self, *, timeout_s: float = 120.0) -> dict[str, Any]:
        """The device's name, limits, driver and clocks (:meth:`tuner.gpu.GpuHandler.device_info`)."""
        return self.call(self.handler.device_info, timeout_s=timeout_s)

    def device_count(self, *, timeout_s: float = 120.0) -> int:
        """How many GPUs the worker process sees."""
        return self.call(self.handler.device_count, timeout_s=timeout_s)

    def prepare(self, problem: Problem, settings: MeasureSettings, *, timeout_s: float = 300.0) -> float:
        """The problem's inputs, reference and warm-up before its first job; returns the ms it took."""
        return self.call(self.handler.prepare, problem, settings, timeout_s=timeout_s)

    def peers(
        self,
        problem: Problem,
        settings: MeasureSettings | None = None,
        names: Collection[str] | None = None,
        *,
        timeout_s: float = 600.0,
    ) -> list[dict[str, Any]]:
        """The peers (PyTorch SDPA backends, a cuBLAS GEMM; those of ``names``, default all:
        :data:`tuner.gpu.PEER_NAMES`) timed on ``problem``: a row each."""
        return self.call(self.handler.run_peers, problem, settings, names, timeout_s=timeout_s)

    def measure(self, job: MeasureJob, *, timeout_s: float = 120.0) -> MeasureResult:
        """Run a measurement job; a hang, a crash or a CUDA error becomes the job's result. Only a
        worker that cannot be started raises (:class:`WorkerUnavailable`): that is not the job's fault."""
        try:
            return self.call(self.handler.run_job, job, timeout_s=timeout_s)
        except WorkerUnavailable:
            raise
        except WorkerTimeout as e:
            return MeasureResult(status="timeout", detail=str(e))
        except WorkerCrashed as e:
            return MeasureResult(status="crashed", detail=str(e))
        except WorkerError as e:
            return MeasureResult(status="launch_error", detail=str(e)[:500])


def _serve(conn: Connection, handler_reference: bytes, device: int, parent_pid: int) -> None:
    """The child's loop: the handler made and set up (a failure is reported: no worker), then calls until
    the parent says stop, goes away, or a fatal error ends the process."""
    ignore_stop_signals()  # the tuner stops this process once it has stored how it stopped
    try:
        handler = pickle.loads(handler_reference)()  # here, not in spawn's start: an import error is reported
        handler.setup(device)
    except BaseException as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", None))
    while (message := _next_message(conn, parent_pid)) is not None:
        try:
            function, arguments = ForkingPickler.loads(message)  # raises for a function this process cannot import
            result = function(handler, *arguments)
        except BaseException as e:
            _report(conn, handler, e)
            continue
        conn.send(("result", result))


def _next_message(conn: Connection, parent_pid: int) -> bytes | None:
    """The next call, pickled, or None to stop: the parent asked (an empty message), closed the pipe, or is
    gone."""
    while not conn.poll(1.0):
        if os.getppid() != parent_pid:  # orphaned: the tuner is gone
            return None
    try:
        message = conn.recv_bytes()
    except EOFError:
        return None
    return message or None


def _report(conn: Connection, handler: GpuHandler, exc: BaseException) -> None:
    """Send ``exc`` to the parent; exit when the handler calls it fatal (the context may be unusable)."""
    lines = traceback.format_exception_only(type(exc), exc)
    fatal = handler.is_fatal(exc)
    conn.send(("fatal" if fatal else "error", "".join(lines).strip()))
    if fatal:
        time.sleep(0.05)
        os._exit(3)
