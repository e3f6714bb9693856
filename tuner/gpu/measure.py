"""The GPU worker's handler: check a kernel against a float32 reference, then time it.

Runs inside the process started by :class:`tuner.worker.Worker`; a CUDA error here is fatal
(``is_fatal``), so the worker exits and the next job gets a fresh context.
"""

from __future__ import annotations

import math
import time

import cupy
import numpy as np

from ..jobs import TOLERANCES, MeasureJob, MeasureResult
from .launch import load_kernel
from .reference import masked_rows, reference_head
from .tensors import poison, random_inputs, storage_dtype, to_float32

__all__ = ["setup", "is_fatal", "device_count", "device_info", "run_job", "check_kernel", "time_kernel"]

_FULL_CHECK_ELEMENTS = 1 << 28  # every row of every head when B*H*Nq*Nk is at most this, else strided rows
_MAX_ROW_STRIDE = 64  # one consumer warpgroup's rows: a strided check still sees every 64-row block
_jobs_run = 0


def check_rows(batch: int, heads: int, seqlen_q: int, seqlen_k: int, rng: np.random.Generator) -> np.ndarray | None:
    """The query rows each (batch, head) is compared on: None for all of them, else every
    ``stride``-th row from a random offset, plus the last row.

    Every (batch, head) is always checked, so a kernel that computes some work units wrong
    (a scheduler or cluster bug) cannot pass on the units it gets right. The stride is the
    smallest power of two that keeps the reference within ``_FULL_CHECK_ELEMENTS``, at most
    ``_MAX_ROW_STRIDE``, so every block of 64 query rows has a row in the check.
    """
    stride = 1
    while batch * heads * math.ceil(seqlen_q / stride) * seqlen_k > _FULL_CHECK_ELEMENTS and stride < _MAX_ROW_STRIDE:
        stride *= 2
    if stride == 1:
        return None
    rows = np.arange(int(rng.integers(stride)), seqlen_q, stride)
    return np.union1d(rows, [seqlen_q - 1])


def setup(device: int) -> None:
    cupy.cuda.Device(device).use()
    cupy.cuda.runtime.free(cupy.cuda.runtime.malloc(1))  # create the context now, not in the first job


def is_fatal(exc: BaseException) -> bool:
    """CUDA errors can leave the context unusable (illegal address, launch failure): start afresh."""
    from cupy_backends.cuda.api import driver, runtime

    return isinstance(exc, (driver.CUDADriverError, runtime.CUDARuntimeError))


def device_info(_: object = None) -> dict[str, object]:
    """Name, limits, driver and clocks of the current device."""
    from .info import gpu_info

    return gpu_info()


def device_count(_: object = None) -> int:
    return cupy.cuda.runtime.getDeviceCount()


def run_job(job: MeasureJob) -> MeasureResult:
    global _jobs_run
    _jobs_run += 1
    p = job.problem
    kernel = load_kernel(job.cubin_path, job.entry, abi=job.abi, grid=job.grid, threads=job.threads,
                         smem_bytes=job.smem_bytes, config=job.config, abi_params=job.abi_params)
    seed = job.settings.seed * 1_000_003 + _jobs_run * 7919 + int(time.time_ns() % 1_000_000)
    q, k, v = random_inputs(p, seed, scale=job.settings.input_scale)
    o = cupy.empty(q.shape, dtype=storage_dtype(p.dtype))
    lse = cupy.empty((p.batch, p.heads_q, p.seqlen_q), dtype=cupy.float32)
    scale = 1.0 / math.sqrt(p.head_dim)
    args = kernel.args(q, k, v, o, lse, scale)
    rel_error = lse_error = None
    if job.settings.check:
        failure, rel_error, lse_error = check_kernel(kernel, args, p, q, k, v, o, lse, scale, seed)
        if failure:
            return MeasureResult(status="wrong_result", detail=failure, rel_error=rel_error, lse_error=lse_error)
    if not job.settings.timing:
        return MeasureResult(status="ok", rel_error=rel_error, lse_error=lse_error)
    median_ms, spread, reps = time_kernel(lambda: kernel.launch(args), job.settings)
    return MeasureResult(status="ok", latency_ms=median_ms, spread=spread, reps=reps,
                         tflops=p.flops / (median_ms * 1e-3) / 1e12, rel_error=rel_error, lse_error=lse_error)


def check_kernel(kernel, args, p, q, k, v, o, lse, scale: float, seed: int) -> tuple[str | None, float, float]:
    """Run once on poisoned outputs; return (failure or None, worst relative O error, worst LSE error)."""
    poison(o, p.dtype)
    poison(lse)
    kernel.launch(args)
    cupy.cuda.Device().synchronize()
    of = to_float32(o, p.dtype)
    bad = int((~cupy.isfinite(of)).sum())
    if bad:
        return f"{bad} of {of.size} output elements are unwritten or not finite", math.inf, math.inf
    nan_lse = int(cupy.isnan(lse).sum())
    if nan_lse:
        return f"{nan_lse} of {lse.size} LSE values are unwritten or NaN", math.inf, math.inf
    dead = masked_rows(p.seqlen_q, p.seqlen_k, p.causal)
    if dead:
        if bool((of[:, :dead] != 0).any()) or bool((lse[:, :, :dead] != -cupy.inf).any()):
            return f"rows that see no key must give O = 0 and LSE = -inf (first {dead} rows)", math.inf, math.inf
    if bool(cupy.isneginf(lse[:, :, dead:]).any()):
        return "LSE is -inf on a row that sees keys", math.inf, math.inf

    group = p.heads_q // p.heads_kv
    rows = check_rows(p.batch, p.heads_q, p.seqlen_q, p.seqlen_k, np.random.default_rng(seed))
    picked = slice(None) if rows is None else cupy.asarray(rows)
    o_tol, lse_tol = TOLERANCES[p.dtype]
    worst_rel = worst_lse = 0.0
    for b, h in ((b, h) for b in range(p.batch) for h in range(p.heads_q)):
        qh, kh, vh = (to_float32(x, p.dtype) for x in (q[b, :, h], k[b, :, h // group], v[b, :, h // group]))
        ref_o, ref_lse = reference_head(qh, kh, vh, scale, p.causal, rows=rows)
        got = of[b, :, h][picked]
        norm = float(cupy.linalg.norm(ref_o))
        rel = float(cupy.linalg.norm(got - ref_o)) / max(norm, 1e-30) if norm else float(cupy.abs(got).max())
        live = cupy.isfinite(ref_lse)
        lse_err = float(cupy.abs(lse[b, h][picked][live] - ref_lse[live]).max()) if bool(live.any()) else 0.0
        worst_rel, worst_lse = max(worst_rel, rel), max(worst_lse, lse_err)
        if not rel <= o_tol:
            return f"O relative error {rel:.3g} > {o_tol:g} at batch {b}, head {h}", worst_rel, worst_lse
        if not lse_err <= lse_tol:
            return f"LSE error {lse_err:.3g} > {lse_tol:g} at batch {b}, head {h}", worst_rel, worst_lse
    return None, worst_rel, worst_lse


def time_kernel(launch, settings) -> tuple[float, float, int]:
    """Median latency (ms) over many event-timed launches after warm-up, its IQR/median, and the count."""
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    flush = cupy.empty(64 * 1024 * 1024, dtype=cupy.int32) if settings.flush_l2 else None  # 256 MB > any L2

    def once(i: int) -> float:
        if flush is not None:
            flush.fill(i)
        start.record()
        launch()
        end.record()
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end)

    warm_start = time.perf_counter()
    first = once(0)
    while (time.perf_counter() - warm_start) * 1e3 < settings.warmup_ms:
        first = once(0)
    reps = int(min(settings.max_reps, max(settings.min_reps, settings.target_ms / max(first, 1e-3))))
    times = np.array([once(i + 1) for i in range(reps)])
    median = float(np.median(times))
    q1, q3 = np.percentile(times, [25, 75])
    return median, float((q3 - q1) / median), reps


def run_peers(argument: tuple) -> list[dict[str, object]]:
    """``(problem, settings)``: PyTorch SDPA backends and a cuBLAS GEMM timed here (see :mod:`.peers`)."""
    from .peers import time_peers

    return time_peers(argument)
