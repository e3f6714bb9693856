"""The GPU worker's handler: check a kernel against a float32 reference, then time it.

Runs inside the process started by :class:`tuner.worker.Worker`; a CUDA error here is fatal
(``is_fatal``), so the worker exits and the next job gets a fresh context.

A job's phases, each in :attr:`MeasureResult.phases_ms`: ``load`` (module, function, kernel
arguments), ``inputs`` (random Q, K, V and their reference, made once per problem and kept:
0 when kept data served the job, see :mod:`.inputs`), ``check`` (one launch on poisoned
outputs, compared with the reference on every (batch, head)) and ``timing`` (adaptive, see
:func:`time_kernel`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import cupy

from ._jobs import TOLERANCES, MeasureJob, MeasureResult, MeasureSettings
from ._inputs import InputCache, ProblemData, check_rows, make_problem_data, softmax_scale
from ._launch import load_kernel
from ._reference import masked_rows
from ._stopping import TimingStats, next_batch, timing_stats, warmup_launches
from ._tensors import poison, storage_dtype, to_float32

__all__ = ["setup", "is_fatal", "device_count", "device_info", "prepare", "run_job", "check_kernel", "check_output",
           "time_kernel", "Timing", "check_rows"]

_FALLBACK_FLUSH_BYTES = 256 * 1024 * 1024  # when the device does not say how large its L2 is
_inputs: InputCache[ProblemData] = InputCache(make_problem_data, capacity=2)  # this process's kept problems
_event_pool: list[tuple[cupy.cuda.Event, cupy.cuda.Event]] = []


def setup(device: int) -> None:
    cupy.cuda.Device(device).use()
    cupy.cuda.runtime.free(cupy.cuda.runtime.malloc(1))  # create the context now, not in the first job


def is_fatal(exc: BaseException) -> bool:
    """CUDA errors can leave the context unusable (illegal address, launch failure): start afresh."""
    from cupy_backends.cuda.api import driver, runtime

    return isinstance(exc, (driver.CUDADriverError, runtime.CUDARuntimeError))


def device_info(_: object = None) -> dict[str, object]:
    """Name, limits, driver and clocks of the current device."""
    from ._info import gpu_info

    return gpu_info()


def device_count(_: object = None) -> int:
    return cupy.cuda.runtime.getDeviceCount()


def _ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


def prepare(argument: tuple) -> float:
    """``(problem, settings)``, before a study's first job: compile CuPy's kernels of the data and check
    paths (seconds on a new machine: :func:`_warm_up`), make the problem's inputs and reference (kept
    for its jobs) and run the check once on a zero output, so that all of it happens beside the tuner's
    first compiles, not inside the first measurement. Returns its ms."""
    p, settings = argument
    t0 = time.perf_counter()
    _warm_up(p, settings)
    data, _ = _inputs.get(p, settings.input_scale, settings.seed, fresh=False)
    o, lse = _zero_outputs(p)
    check_output(p, data, o, lse)
    data.intact()
    _timed_batch(lambda: None, 1, _flush_buffer() if settings.flush_l2 else None)  # the flush buffer, the events
    return _ms_since(t0)


def _zero_outputs(p):
    """Zero O and LSE of ``p``'s shape, poisoned first (the check's poison kernels compile here too)."""
    o = cupy.empty((p.batch, p.seqlen_q, p.heads_q, p.head_dim), dtype=storage_dtype(p.dtype))
    lse = cupy.empty((p.batch, p.heads_q, p.seqlen_q), dtype=cupy.float32)
    poison(o, p.dtype)
    poison(lse)
    o.fill(0)
    lse.fill(0)
    return o, lse


def _warm_up(p, settings: MeasureSettings) -> None:
    """Compile the kernels CuPy needs for ``p``'s data and check, several at once: each path runs on a tiny
    problem of the same dtype, mask, head dim and head grouping in a thread of its own (NVRTC compiles
    without holding the GIL). What the tiny runs miss compiles when it is first used."""
    tiny = dataclasses.replace(p, batch=1, heads_q=p.heads_q // p.heads_kv, heads_kv=1,
                               seqlen_q=min(p.seqlen_q, 96), seqlen_k=min(p.seqlen_k, 80 if p.seqlen_k < p.seqlen_q
                                                                       else 96))
    device = cupy.cuda.Device().id

    def data_path() -> None:
        make_problem_data(tiny, settings.input_scale, 0)

    def check_path() -> None:
        ref_o = cupy.ones((tiny.batch, tiny.seqlen_q, tiny.heads_q, tiny.head_dim), dtype=cupy.float32)
        ref_lse = cupy.ones((tiny.batch, tiny.heads_q, tiny.seqlen_q), dtype=cupy.float32)
        data = ProblemData(q=None, k=None, v=None, rows=None, ref_o=ref_o, ref_lse=ref_lse, seed=0)
        check_output(tiny, data, *_zero_outputs(tiny))

    def on_device(path: Callable[[], None]) -> None:
        cupy.cuda.Device(device).use()  # a thread's current device is device 0 until it says otherwise
        path()
        cupy.cuda.get_current_stream().synchronize()

    with concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="flashtune-warm-up") as pool:
        for future in [pool.submit(on_device, path) for path in (data_path, check_path)]:
            future.result()


def run_job(job: MeasureJob) -> MeasureResult:
    t_job = time.perf_counter()
    p, settings = job.problem, job.settings
    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    kernel = load_kernel(job.cubin_path, job.entry, abi=job.abi, grid=job.grid, threads=job.threads,
                         smem_bytes=job.smem_bytes, config=job.config, abi_params=job.abi_params)
    phases["load"] = _ms_since(t0)
    t0 = time.perf_counter()
    data, reused = _inputs.get(p, settings.input_scale, settings.seed, fresh=settings.fresh_inputs)
    phases["inputs"] = 0.0 if reused else _ms_since(t0)
    t0 = time.perf_counter()
    o = cupy.empty(data.q.shape, dtype=storage_dtype(p.dtype))
    lse = cupy.empty((p.batch, p.heads_q, p.seqlen_q), dtype=cupy.float32)
    args = kernel.args(data.q, data.k, data.v, o, lse, softmax_scale(p))
    phases["load"] += _ms_since(t0)  # the arguments (tensor maps) belong to loading the kernel

    kernel_ms = 0.0
    check_ms: float | None = None
    fields: dict[str, object] = {}
    failure = None
    try:
        if settings.check:
            t0 = time.perf_counter()
            failure, rel_error, lse_error, check_ms = check_kernel(kernel, args, p, data, o, lse)
            kernel_ms += check_ms
            fields.update(rel_error=rel_error, lse_error=lse_error)
            phases["check"] = _ms_since(t0)
        if settings.timing and failure is None:
            t0 = time.perf_counter()
            timing = time_kernel(lambda: kernel.launch(args), settings, estimate_ms=check_ms)
            kernel_ms += timing.kernel_ms
            stats = timing.stats
            fields.update(latency_ms=stats.median_ms, spread=stats.spread, reps=stats.reps, rel_ci=stats.rel_ci,
                          tflops=p.flops / (stats.median_ms * 1e-3) / 1e12 if stats.median_ms > 0 else None)
            phases["timing"] = _ms_since(t0)
        t0 = time.perf_counter()
        intact = data.intact()
        phases["check"] = phases.get("check", 0.0) + _ms_since(t0)
    except BaseException:
        _inputs.discard(data)  # a launch may have written over it, and nothing vetted it
        raise
    if not intact:
        _inputs.discard(data)
        wrote = "the kernel wrote outside its outputs (into its inputs or the reference kept for them)"
        failure = wrote if failure is None else f"{wrote}; {failure}"
        fields = {k: v for k, v in fields.items() if k in ("rel_error", "lse_error")}
    accounting = {"kernel_ms": kernel_ms, "job_ms": _ms_since(t_job),
                  "phases_ms": {name: round(ms, 3) for name, ms in phases.items()}}
    if failure:
        return MeasureResult(status="wrong_result", detail=failure, **fields, **accounting)
    return MeasureResult(status="ok", **fields, **accounting)


def check_kernel(kernel, args, p, data: ProblemData, o, lse) -> tuple[str | None, float, float, float]:
    """Run once on poisoned outputs; return (failure or None, worst relative O error over the (batch, head)
    pairs, worst LSE error, the launch's GPU time in ms)."""
    poison(o, p.dtype)
    poison(lse)
    launch_ms = _timed_batch(lambda: kernel.launch(args), 1, None)[0]
    return (*check_output(p, data, o, lse), launch_ms)


def check_output(p, data: ProblemData, o, lse) -> tuple[str | None, float, float]:
    """Compare a kernel's output with the reference: (failure or None, worst relative O error over the
    (batch, head) pairs, worst LSE error). ``o`` [B, Nq, Hq, D] in the storage type, ``lse`` fp32
    [B, Hq, Nq]; CuPy arrays, or NumPy ones (the CPU tests)."""
    xp = cupy.get_array_module(o)
    of = to_float32(o, p.dtype)
    bad = int((~xp.isfinite(of)).sum())
    if bad:
        return f"{bad} of {of.size} output elements are unwritten or not finite", math.inf, math.inf
    nan_lse = int(xp.isnan(lse).sum())
    if nan_lse:
        return f"{nan_lse} of {lse.size} LSE values are unwritten or NaN", math.inf, math.inf
    dead = masked_rows(p.seqlen_q, p.seqlen_k, p.causal)
    if dead:
        if bool((of[:, :dead] != 0).any()) or bool((lse[:, :, :dead] != -xp.inf).any()):
            return f"rows that see no key must give O = 0 and LSE = -inf (first {dead} rows)", math.inf, math.inf
    if bool(xp.isneginf(lse[:, :, dead:]).any()):
        return "LSE is -inf on a row that sees keys", math.inf, math.inf

    rel, lse_err = _errors_by_head(of, lse, data)
    o_tol, lse_tol = TOLERANCES[p.dtype]
    worst_rel, worst_lse = float(rel.max()), float(lse_err.max())
    for b in range(p.batch):  # every (batch, head) is checked; the first that fails is named
        for h in range(p.heads_q):
            if not rel[b, h] <= o_tol:
                return f"O relative error {rel[b, h]:.3g} > {o_tol:g} at batch {b}, head {h}", worst_rel, worst_lse
            if not lse_err[b, h] <= lse_tol:
                return f"LSE error {lse_err[b, h]:.3g} > {lse_tol:g} at batch {b}, head {h}", worst_rel, worst_lse
    return None, worst_rel, worst_lse


def _errors_by_head(of, lse, data: ProblemData):
    """Per (batch, head), on the checked rows, as NumPy [B, H]: the relative L2 error of O (the largest
    |O| where the reference is all zero) and the largest |LSE - reference| over rows that see a key.
    ``of``: the output as fp32 [B, Nq, H, D]; ``lse``: [B, H, Nq]. CuPy or NumPy arrays."""
    xp = cupy.get_array_module(of)
    if data.rows is None:
        got, got_lse = of, lse
    else:
        picked = xp.asarray(data.rows)
        got, got_lse = of[:, picked], lse[:, :, picked]
    ref_o, ref_lse = data.ref_o, data.ref_lse
    err = xp.sqrt(xp.square(got - ref_o).sum(axis=(1, 3)))
    norm = xp.sqrt(xp.square(ref_o).sum(axis=(1, 3)))
    largest = xp.abs(got).max(axis=(1, 3))
    rel = xp.where(norm > 0, err / xp.maximum(norm, xp.float32(1e-30)), largest)
    live = xp.isfinite(ref_lse)
    zero = xp.float32(0.0)
    lse_err = xp.where(live, xp.abs(got_lse - xp.where(live, ref_lse, zero)), zero).max(axis=2)
    both = cupy.asnumpy(xp.stack([rel, lse_err]))  # one sync
    return both[0], both[1]


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
def _flush_buffer():
    """A buffer of twice the device's L2: overwriting it evicts whatever the last launch left there."""
    device = cupy.cuda.Device()
    l2_bytes = cupy.cuda.runtime.deviceGetAttribute(cupy.cuda.runtime.cudaDevAttrL2CacheSize, device.id)
    nbytes = 2 * l2_bytes if l2_bytes > 0 else _FALLBACK_FLUSH_BYTES
    return cupy.empty(nbytes // 4, dtype=cupy.int32)


def _timed_batch(launch: Callable[[], object], n: int, flush) -> list[float]:
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
    flush, with no host sync inside a batch, until :func:`.stopping.next_batch` says the median is
    known to ``settings.rel_ci``, or ``settings.max_reps`` launches or ``settings.target_ms`` of
    wall time are reached (never below ``settings.min_reps``).
    """
    flush = _flush_buffer() if settings.flush_l2 else None
    kernel_ms, warm = 0.0, 0
    if estimate_ms is None:
        first = _timed_batch(launch, 1, flush)
        estimate_ms, kernel_ms, warm = first[0], first[0], 1
    more = warmup_launches(settings.warmup_ms, estimate_ms) - warm
    if more > 0:
        kernel_ms += sum(_timed_batch(launch, more, flush))
        warm += more
    samples: list[float] = []
    t0 = time.perf_counter()
    while (n := next_batch(samples, spent_ms=_ms_since(t0), min_reps=settings.min_reps, max_reps=settings.max_reps,
                           budget_ms=settings.target_ms, rel_ci=settings.rel_ci)) > 0:
        batch = _timed_batch(launch, n, flush)
        samples += batch
        kernel_ms += sum(batch)
    return Timing(stats=timing_stats(samples), kernel_ms=kernel_ms, warmup_reps=warm)


def run_peers(argument: tuple) -> list[dict[str, object]]:
    """``(problem, settings)``: PyTorch SDPA backends and a cuBLAS GEMM timed here (see :mod:`.peers`)."""
    from ._peers import time_peers

    return time_peers(argument)
