"""Timing work queued on CuPy's current stream: CUDA events around each launch, an L2 flush before it.

Runs in the GPU worker. flashtune's kernels (:mod:`._measure`) and their peers (:mod:`._peers`:
PyTorch SDPA and cuBLAS, which launch on the legacy default stream, CuPy's current stream
there, so the events frame them) are timed by the same :func:`time_kernel`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import cupy

from ._jobs import MeasureSettings
from ._stopping import TimingStats, next_batch, timing_stats, warmup_launches

__all__ = ["Timing", "flush_buffer", "ms_since", "time_kernel", "timed_batch"]

_FALLBACK_FLUSH_BYTES = 256 * 1024 * 1024  # when the device does not say how large its L2 is
_event_pool: list[tuple[cupy.cuda.Event, cupy.cuda.Event]] = []


def ms_since(t0: float) -> float:
    """Wall time in ms since ``t0`` (a :func:`time.perf_counter` reading)."""
    return (time.perf_counter() - t0) * 1e3


@dataclass(frozen=True, kw_only=True)
class Timing:
    """What :func:`time_kernel` measured: the statistics of the timed launches, the GPU time of every
    launch it made (warm-up included) and how many were warm-up."""

    stats: TimingStats
    kernel_ms: float
    warmup_reps: int


def _event_pairs(n: int) -> list:
    """``n`` (start, end) timing events, reused from call to call (every use ends with a sync)."""
    while len(_event_pool) < n:
        _event_pool.append((cupy.cuda.Event(), cupy.cuda.Event()))
    return _event_pool[:n]


@functools.cache
def flush_buffer():
    """A buffer of twice the device's L2: overwriting it evicts whatever the last launch left there."""
    device = cupy.cuda.Device()
    l2_bytes = cupy.cuda.runtime.deviceGetAttribute(cupy.cuda.runtime.cudaDevAttrL2CacheSize, device.id)
    nbytes = 2 * l2_bytes if l2_bytes > 0 else _FALLBACK_FLUSH_BYTES
    return cupy.empty(nbytes // 4, dtype=cupy.int32)


def timed_batch(launch: Callable[[], object], n: int, flush) -> list[float]:
    """Queue ``n`` launches, each between two events and after a flush of the L2 when ``flush`` is
    given; one host sync at the end. Returns each launch's GPU time in ms."""
    stream = cupy.cuda.get_current_stream()
    pairs = _event_pairs(n)
    for i, (start, end) in enumerate(pairs):
        if flush is not None:  # on the current stream, before the start event: not timed. One runtime call,
            # where flush.fill is a kernel launch through CuPy's dispatch: tens of us of host time per launch
            cupy.cuda.runtime.memsetAsync(flush.data.ptr, (i + 1) & 0xFF, flush.nbytes, stream.ptr)
        start.record(stream)
        launch()
        end.record(stream)
    pairs[-1][1].synchronize()
    return [cupy.cuda.get_elapsed_time(start, end) for start, end in pairs]


def time_kernel(launch: Callable[[], object], settings: MeasureSettings, *, estimate_ms: float | None = None) -> Timing:
    """Time ``launch`` (work queued on CuPy's current stream) adaptively, as Triton's ``do_bench`` does.

    Warm-up launches (about ``settings.warmup_ms`` of kernel time; a launch alone first when no
    ``estimate_ms`` of one launch is known), then batches of event-timed launches, each after an L2
    flush, with no host sync inside a batch, until :func:`._stopping.next_batch` says the median is
    known to ``settings.rel_ci``, or ``settings.max_reps`` launches or ``settings.target_ms`` of
    wall time are reached (never below ``settings.min_reps``).
    """
    flush = flush_buffer() if settings.flush_l2 else None
    kernel_ms, warm = 0.0, 0
    if estimate_ms is None:
        first = timed_batch(launch, 1, flush)
        estimate_ms, kernel_ms, warm = first[0], first[0], 1
    more = warmup_launches(settings.warmup_ms, estimate_ms) - warm
    if more > 0:
        kernel_ms += sum(timed_batch(launch, more, flush))
        warm += more
    samples: list[float] = []
    t0 = time.perf_counter()
    while (
        n := next_batch(
            samples,
            spent_ms=ms_since(t0),
            min_reps=settings.min_reps,
            max_reps=settings.max_reps,
            budget_ms=settings.target_ms,
            rel_ci=settings.rel_ci,
        )
    ) > 0:
        batch = timed_batch(launch, n, flush)
        samples += batch
        kernel_ms += sum(batch)
    return Timing(stats=timing_stats(samples), kernel_ms=kernel_ms, warmup_reps=warm)
