"""A long-lived measuring process per GPU, isolated from the tuner.

The child imports a handler module (by default :mod:`tuner.gpu.measure`), calls its
``setup(device)`` once, then serves calls ``(function name, argument)``. The parent enforces
a timeout on every call: a hung kernel (a deadlocked barrier, say) is killed with its process
and the next call starts a fresh one; a child that dies (an illegal address makes a CUDA
context unusable, so the handler exits on purpose) is noticed at once. Either way the caller
gets an answer and the study goes on. The child also exits when its parent disappears.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from ..errors import FlashtuneError
from ..gpu import MeasureJob, MeasureResult

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


class Worker:
    """Run calls in a child process; see the module docstring."""

    def __init__(self, *, handler: str = "tuner.gpu._measure", device: int = 0, startup_timeout_s: float = 180.0) -> None:
        self.handler = handler
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
        process = ctx.Process(target=_serve, args=(child_conn, self.handler, self.device, os.getpid()),
                              name=f"flashtune-worker-{self.device}", daemon=True)
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
            raise WorkerUnavailable(f"worker for GPU {self.device} died while starting (exit code {process.exitcode})"
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
                child.conn.send(None)
                child.process.join(timeout=5)
            except (OSError, BrokenPipeError):
                pass
        self._reap()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls -----------------------------------------------------------------------------
    def call(self, function: str, argument: Any = None, *, timeout_s: float = 120.0) -> Any:
        """Run ``handler.function(argument)`` in the child and return its result. Calls from several threads
        (a GPU's measuring lane and the re-timing after it) take turns: one call at a time is on the pipe."""
        with self._calling:
            return self._call(function, argument, timeout_s)

    def _call(self, function: str, argument: Any, timeout_s: float) -> Any:
        child = self._ensure()
        child.conn.send((function, argument))
        if not child.conn.poll(timeout_s):
            self._reap()
            raise WorkerTimeout(f"{function} did not finish within {timeout_s:.0f} s; the worker was killed")
        try:
            kind, payload = child.conn.recv()
        except (EOFError, ConnectionResetError):
            child.process.join(timeout=10)
            code = child.process.exitcode
            self._reap()
            raise WorkerCrashed(f"worker died during {function} (exit code {code})") from None
        if kind == "fatal":  # the child exits after a fatal error: do not wait for it
            self._reap()
        if kind in ("error", "fatal"):
            raise WorkerError(payload)
        return payload

    def measure(self, job: MeasureJob, *, timeout_s: float = 120.0) -> MeasureResult:
        """Run a measurement job; a hang, a crash or a CUDA error becomes the job's result. Only a
        worker that cannot be started raises (:class:`WorkerUnavailable`): that is not the job's fault."""
        try:
            return self.call("run_job", job, timeout_s=timeout_s)
        except WorkerUnavailable:
            raise
        except WorkerTimeout as e:
            return MeasureResult(status="timeout", detail=str(e))
        except WorkerCrashed as e:
            return MeasureResult(status="crashed", detail=str(e))
        except WorkerError as e:
            return MeasureResult(status="launch_error", detail=str(e)[:500])


def _serve(conn: Connection, handler: str, device: int, parent_pid: int) -> None:
    """The child's loop. A handler may define ``is_fatal(exc)``: then the child exits after reporting."""
    try:
        module = importlib.import_module(handler)
        if hasattr(module, "setup"):
            module.setup(device)
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which decides
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", None))
    is_fatal = getattr(module, "is_fatal", lambda exc: False)
    while True:
        while not conn.poll(1.0):
            if os.getppid() != parent_pid:  # orphaned: the tuner is gone
                return
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        function, argument = message
        try:
            result = getattr(module, function)(argument)
        except BaseException as e:  # noqa: BLE001
            lines = traceback.format_exception_only(type(e), e)
            fatal = is_fatal(e)
            conn.send(("fatal" if fatal else "error", "".join(lines).strip()))
            if fatal:
                time.sleep(0.05)
                os._exit(3)
            continue
        conn.send(("result", result))
