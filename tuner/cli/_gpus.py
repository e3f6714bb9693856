"""The GPUs a command runs on: ``--gpus`` read, workers started, and one message when there is no GPU.

The commands call these through the module (``_gpus.parse``, ``_gpus.start_worker``), so a test or
a stand-in host can replace one of them for every command at once.
"""

from __future__ import annotations

import contextlib

from ..devices import gpu_unavailable, missing_driver
from ..errors import UsageError
from ..text import printable

__all__ = ["infos", "no_gpu_message", "open_all", "parse", "start_worker"]


def parse(text: str) -> list[int]:
    """``0``, ``0,2,3`` or ``all``."""
    if text == "all":
        from ..run import Worker, WorkerError

        with Worker(device=0) as worker:
            try:
                return list(range(worker.device_count(timeout_s=120)))
            except WorkerError as e:
                raise gpu_unavailable(None, str(e)) from None
    try:
        gpus = [int(g) for g in text.split(",")]
    except ValueError:
        raise UsageError(f"--gpus takes device indices like 0,1,3 or 'all', not {printable(text, 60)!r}") from None
    if not gpus or len(set(gpus)) != len(gpus) or min(gpus) < 0:
        raise UsageError(f"--gpus must list distinct device indices, got {printable(text, 60)!r}")
    return gpus


def start_worker(device: int):
    """A GPU worker and what it reports about its device; a clear error when there is no GPU."""
    from ..run import Worker, WorkerError

    worker = Worker(device=device)
    try:
        info = worker.device_info(timeout_s=120)
    except WorkerError as e:
        worker.close()
        raise gpu_unavailable(device, str(e)) from None
    return worker, info


def infos(gpus: list[int]):
    """What each GPU reports (:func:`tuner.run.gpu_infos`), with the one no-GPU message when there is no driver."""
    from ..run import gpu_infos

    with no_gpu_message(gpus):
        return gpu_infos(gpus)


@contextlib.contextmanager
def open_all(gpus: list[int]):
    """A started worker per GPU and what each reports (:func:`tuner.run.open_gpus`), with the one no-GPU message."""
    from ..run import open_gpus

    with no_gpu_message(gpus), open_gpus(gpus) as opened:
        yield opened


@contextlib.contextmanager
def no_gpu_message(gpus: list[int]):
    """Where no NVIDIA driver is installed, a "no usable GPU" error becomes the one no-GPU message."""
    try:
        yield
    except UsageError as e:
        if "no usable GPU" in str(e) and missing_driver():  # CUDA blames "driver version insufficient"
            raise gpu_unavailable(gpus[0] if len(gpus) == 1 else None, str(e)) from None
        raise
