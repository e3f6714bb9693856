"""Check a kernel against a float32 reference, then time it: the work of :meth:`.CupyHandler.run_job`.

Runs inside the process started by :class:`tuner.run.Worker`; a CUDA error here is fatal
(:meth:`.CupyHandler.is_fatal`), so the worker exits and the next job gets a fresh context.

A job's phases, each in :attr:`MeasureResult.phases_ms`: ``load`` (module, function, kernel
arguments), ``inputs`` (random Q, K, V and their reference, made once per problem and kept:
0 when kept data served the job, see :mod:`._inputs`), ``check`` (one launch on poisoned
outputs, compared with the reference on every (batch, head)) and ``timing`` (adaptive, see
:func:`._timing.time_kernel`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import time
from collections.abc import Callable

import cupy

from ..problem import Problem
from ._inputs import InputCache, ProblemData, make_problem_data, softmax_scale
from ._jobs import TOLERANCES, MeasureJob, MeasureResult, MeasureSettings
from ._launch import load_kernel
from ._reference import masked_rows
from ._tensors import poison, storage_dtype, to_float32
from ._timing import flush_buffer, ms_since, time_kernel, timed_batch

__all__ = ["check_kernel", "check_output", "prepare", "run_job"]

_inputs: InputCache[ProblemData] = InputCache(make_problem_data, capacity=2)  # this process's kept problems


def prepare(p: Problem, settings: MeasureSettings) -> float:
    """Before a study's first job of problem ``p``: compile CuPy's kernels of the data and check
    paths (seconds on a new machine: :func:`_warm_up`), make the problem's inputs and reference (kept
    for its jobs) and run the check once on a zero output, so that all of it happens beside the tuner's
    first compiles, not inside the first measurement. Returns its ms."""
    t0 = time.perf_counter()
    _warm_up(p, settings)
    data, _ = _inputs.get(p, settings.input_scale, settings.seed, fresh=False)
    o, lse = _zero_outputs(p)
    check_output(p, data, o, lse)
    data.intact()
    timed_batch(lambda: None, 1, flush_buffer() if settings.flush_l2 else None)  # the flush buffer, the events
    return ms_since(t0)


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
    tiny = dataclasses.replace(
        p,
        batch=1,
        heads_q=p.heads_q // p.heads_kv,
        heads_kv=1,
        seqlen_q=min(p.seqlen_q, 96),
        seqlen_k=min(p.seqlen_k, 80 if p.seqlen_k < p.seqlen_q else 96),
    )
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
    kernel, data, args, o, lse = _prepare(job, phases)
    kernel_ms, fields, failure, intact = _check_and_time(kernel, args, p, settings, data, o, lse, phases)
    if not intact:
        _inputs.discard(data)
        wrote = "the kernel wrote outside its outputs (into its inputs or the reference kept for them)"
        failure = wrote if failure is None else f"{wrote}; {failure}"
        fields = {k: v for k, v in fields.items() if k in ("rel_error", "lse_error")}
    accounting = {
        "kernel_ms": kernel_ms,
        "job_ms": ms_since(t_job),
        "phases_ms": {name: round(ms, 3) for name, ms in phases.items()},
    }
    if failure:
        return MeasureResult(status="wrong_result", detail=failure, **fields, **accounting)
    return MeasureResult(status="ok", **fields, **accounting)


def _prepare(job: MeasureJob, phases: dict[str, float]):
    """Load the kernel, get the problem's inputs and allocate its outputs: (kernel, data, args, o, lse)."""
    p, settings = job.problem, job.settings
    t0 = time.perf_counter()
    kernel = load_kernel(
        job.cubin_path,
        job.entry,
        abi=job.abi,
        grid=job.grid,
        threads=job.threads,
        smem_bytes=job.smem_bytes,
        config=job.config,
        abi_params=job.abi_params,
    )
    phases["load"] = ms_since(t0)
    t0 = time.perf_counter()
    data, reused = _inputs.get(p, settings.input_scale, settings.seed, fresh=settings.fresh_inputs)
    phases["inputs"] = 0.0 if reused else ms_since(t0)
    t0 = time.perf_counter()
    o = cupy.empty(data.q.shape, dtype=storage_dtype(p.dtype))
    lse = cupy.empty((p.batch, p.heads_q, p.seqlen_q), dtype=cupy.float32)
    args = kernel.args(data.q, data.k, data.v, o, lse, softmax_scale(p))
    phases["load"] += ms_since(t0)  # the arguments (tensor maps) belong to loading the kernel
    return kernel, data, args, o, lse


def _check_and_time(
    kernel, args, p, settings: MeasureSettings, data: ProblemData, o, lse, phases: dict[str, float]
) -> tuple[float, dict[str, object], str | None, bool]:
    """Check the kernel's output, time it if it is right, and vet its inputs afterwards: (GPU time in ms,
    the result's fields, failure or None, whether the inputs are intact)."""
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
            phases["check"] = ms_since(t0)
        if settings.timing and failure is None:
            t0 = time.perf_counter()
            timing = time_kernel(lambda: kernel.launch(args), settings, estimate_ms=check_ms)
            kernel_ms += timing.kernel_ms
            stats = timing.stats
            fields.update(
                latency_ms=stats.median_ms,
                spread=stats.spread,
                reps=stats.reps,
                rel_ci=stats.rel_ci,
                tflops=p.flops / (stats.median_ms * 1e-3) / 1e12 if stats.median_ms > 0 else None,
            )
            phases["timing"] = ms_since(t0)
        t0 = time.perf_counter()
        intact = data.intact()
        phases["check"] = phases.get("check", 0.0) + ms_since(t0)
    except BaseException:
        _inputs.discard(data)  # a launch may have written over it, and nothing vetted it
        raise
    return kernel_ms, fields, failure, intact


def check_kernel(kernel, args, p, data: ProblemData, o, lse) -> tuple[str | None, float, float, float]:
    """Run once on poisoned outputs; return (failure or None, worst relative O error over the (batch, head)
    pairs, worst LSE error, the launch's GPU time in ms)."""
    poison(o, p.dtype)
    poison(lse)
    launch_ms = timed_batch(lambda: kernel.launch(args), 1, None)[0]
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
    if dead and (bool((of[:, :dead] != 0).any()) or bool((lse[:, :, :dead] != -xp.inf).any())):
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
