"""One kernel measured the old way (flashtune 6a12dc0) and the new way, in one GPU worker (issue 8).

    python -m tests.gpu.bench_measure [--family sm90] [--json out.json]

The default kernel of ``--family`` on fp16, D 128, causal, batch 4, N 4096, 16 heads (flags change
the problem) is measured ``--repeats`` + 1 times each way: the first measurement of each way is
cold (the new way makes the problem's inputs and reference then), the rest show the spread
between measurements of one config. Per measurement: its wall time seen by the tuner (worker
call included), the median latency, the median's 95% interval (new way), the timed launches, the
IQR spread, and the GPU time in the kernel's launches over the worker's job time (GPU-busy share).

The old way, copied here to compare with: new random inputs and the reference of every (batch,
head) each job; one launch at a time with a host sync, a 256 MB L2 flush before each, after 25 ms
of warm-up, launches for 200 ms (10 to 100).

The worker runs this module's ``run_new_way`` (tuner.gpu.CupyHandler.run_job) and ``run_old_way`` (the old one).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import numpy as np

from tuner.gpu import TOLERANCES, CupyHandler, MeasureJob, MeasureResult, MeasureSettings

OLD = {"warmup_ms": 25.0, "min_reps": 10, "max_reps": 100, "target_ms": 200.0}


# -- the worker's side (the default handler, tuner.gpu.CupyHandler; these functions run in its process) -----


def run_new_way(handler: CupyHandler, job: MeasureJob) -> MeasureResult:
    return handler.run_job(job)


def run_old_way(handler: CupyHandler, job: MeasureJob) -> MeasureResult:
    return run_job_old(job)


def run_job_old(job: MeasureJob) -> MeasureResult:
    """tuner.gpu.CupyHandler.run_job as of 6a12dc0, with the GPU time of its launches summed (events)."""
    import cupy

    from tuner.gpu._inputs import check_rows
    from tuner.gpu._launch import load_kernel
    from tuner.gpu._reference import reference_head
    from tuner.gpu._tensors import poison, random_inputs, storage_dtype, to_float32

    t_job = time.perf_counter()
    p = job.problem
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
    seed = job.settings.seed * 1_000_003 + int(time.time_ns() % 1_000_000)
    q, k, v = random_inputs(p, seed, scale=job.settings.input_scale)
    o = cupy.empty(q.shape, dtype=storage_dtype(p.dtype))
    lse = cupy.empty((p.batch, p.heads_q, p.seqlen_q), dtype=cupy.float32)
    scale = 1.0 / math.sqrt(p.head_dim)
    args = kernel.args(q, k, v, o, lse, scale)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()

    # the check, head by head
    poison(o, p.dtype)
    poison(lse)
    start.record()
    kernel.launch(args)
    end.record()
    cupy.cuda.Device().synchronize()
    kernel_ms = cupy.cuda.get_elapsed_time(start, end)
    of = to_float32(o, p.dtype)
    assert not int((~cupy.isfinite(of)).sum()) and not int(cupy.isnan(lse).sum())
    group = p.heads_q // p.heads_kv
    rows = check_rows(p.batch, p.heads_q, p.seqlen_q, p.seqlen_k, np.random.default_rng(seed))
    picked = slice(None) if rows is None else cupy.asarray(rows)
    worst_rel = worst_lse = 0.0
    for b in range(p.batch):
        for h in range(p.heads_q):
            qh, kh, vh = (to_float32(x, p.dtype) for x in (q[b, :, h], k[b, :, h // group], v[b, :, h // group]))
            ref_o, ref_lse = reference_head(qh, kh, vh, scale, p.causal, rows=rows)
            got = of[b, :, h][picked]
            norm = float(cupy.linalg.norm(ref_o))
            rel = float(cupy.linalg.norm(got - ref_o)) / max(norm, 1e-30) if norm else float(cupy.abs(got).max())
            live = cupy.isfinite(ref_lse)
            lse_err = float(cupy.abs(lse[b, h][picked][live] - ref_lse[live]).max()) if bool(live.any()) else 0.0
            worst_rel, worst_lse = max(worst_rel, rel), max(worst_lse, lse_err)
    o_tol, lse_tol = TOLERANCES[p.dtype]
    if not (worst_rel <= o_tol and worst_lse <= lse_tol):
        return MeasureResult(status="wrong_result", detail=f"rel {worst_rel:.3g}, lse {worst_lse:.3g}")
    t_check = time.perf_counter()

    # the timing, one launch at a time
    flush = cupy.empty(64 * 1024 * 1024, dtype=cupy.int32)
    times: list[float] = []

    def once(i: int) -> float:
        flush.fill(i)
        start.record()
        kernel.launch(args)
        end.record()
        end.synchronize()
        ms = cupy.cuda.get_elapsed_time(start, end)
        times.append(ms)
        return ms

    warm_start = time.perf_counter()
    first = once(0)
    while (time.perf_counter() - warm_start) * 1e3 < OLD["warmup_ms"]:
        first = once(0)
    reps = int(min(OLD["max_reps"], max(OLD["min_reps"], OLD["target_ms"] / max(first, 1e-3))))
    timed = np.array([once(i + 1) for i in range(reps)])
    median = float(np.median(timed))
    q1, q3 = np.percentile(timed, [25, 75])
    job_ms = (time.perf_counter() - t_job) * 1e3
    return MeasureResult(
        status="ok",
        latency_ms=median,
        spread=float((q3 - q1) / median),
        reps=reps,
        tflops=p.flops / (median * 1e-3) / 1e12,
        rel_error=worst_rel,
        lse_error=worst_lse,
        kernel_ms=kernel_ms + sum(times),
        job_ms=job_ms,
        phases_ms={
            "inputs_and_check": round((t_check - t_job) * 1e3, 3),
            "timing": round((time.perf_counter() - t_check) * 1e3, 3),
        },
    )


# -- the tuner's side --------------------------------------------------------------------------------


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _line(way: str, i: int, wall_ms: float, r: MeasureResult) -> str:
    busy = r.kernel_ms / r.job_ms if r.kernel_ms is not None and r.job_ms else None
    ci = None if r.rel_ci is None else 100 * r.rel_ci
    return (
        f"{way:<4} {i:>2} {wall_ms:9.1f} {_fmt(r.latency_ms, '.4f'):>9} {_fmt(ci, '.2f'):>6} {r.reps:>5} "
        f"{_fmt(None if r.spread is None else 100 * r.spread, '.2f'):>7} {_fmt(r.kernel_ms, '.1f'):>9} "
        f"{_fmt(r.job_ms, '.1f'):>9} {_fmt(None if busy is None else 100 * busy, '.1f'):>6}  "
        + " ".join(f"{k}={v:.1f}" for k, v in r.phases_ms.items())
    )


def _summary(way: str, rows: list[tuple[float, MeasureResult]]) -> dict[str, object]:
    warm = rows[1:] or rows  # the first measurement of a way is cold
    lat = [r.latency_ms for _, r in warm]
    med = statistics.median(lat)
    return {
        "way": way,
        "ms_per_measurement": statistics.mean(w for w, _ in warm),
        "cold_ms": rows[0][0],
        "latency_median_ms": med,
        "between_measurements_range": (max(lat) - min(lat)) / med,
        "between_measurements_cv": statistics.pstdev(lat) / statistics.mean(lat),
        "reps_mean": statistics.mean(r.reps for _, r in warm),
        "within_spread_mean": statistics.mean(r.spread for _, r in warm),
        "rel_ci_mean": (
            statistics.mean(r.rel_ci for _, r in warm) if all(r.rel_ci is not None for _, r in warm) else None
        ),
        "gpu_busy_in_job": sum(r.kernel_ms for _, r in warm) / sum(r.job_ms for _, r in warm),
        "gpu_busy_in_wall": sum(r.kernel_ms for _, r in warm) / sum(w for w, _ in warm),
    }


def main(argv: list[str] | None = None) -> int:
    from tuner.compile import compile_config
    from tuner.devices import DeviceLimits
    from tuner.gpu import measure_job_for
    from tuner.problem import Problem
    from tuner.run import Worker
    from tuner.space import load_space

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="sm90")
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--no-causal", dest="causal", action="store_false")
    ap.add_argument("--repeats", type=int, default=5, help="measurements of one config after the first, each way")
    ap.add_argument("--json", help="also write the measurements and summaries here")
    args = ap.parse_args(argv)

    problem = Problem(
        batch=args.batch,
        seqlen_q=args.seqlen,
        heads_q=args.heads,
        head_dim=args.head_dim,
        dtype=args.dtype,
        causal=args.causal,
    )
    report: dict[str, object] = {"problem": problem.to_dict(), "measurements": [], "summaries": []}
    with Worker() as worker:
        info = worker.device_info()
        device = DeviceLimits.from_info(info)
        space = load_space(args.family)
        config = space.defaults(problem.head_dim)
        kernel = compile_config(space, config, problem, device)
        job = measure_job_for(space, config, problem, device, kernel, MeasureSettings(), tag="bench-measure")
        clock = info.get("sm_clock_mhz", "?")
        print(f"{args.family} default on {problem.slug()}, {info['name']} (SM clock {clock} MHz)")
        print(
            f"{'way':<4} {'#':>2} {'wall ms':>9} {'lat ms':>9} {'CI %':>6} {'reps':>5} {'IQR %':>7} "
            f"{'kernel ms':>9} {'job ms':>9} {'busy %':>6}  phases (ms)"
        )
        for way, function in (("old", run_old_way), ("new", run_new_way)):
            rows = []
            for i in range(args.repeats + 1):
                t0 = time.perf_counter()
                result = worker.call(function, job, timeout_s=600)
                wall_ms = (time.perf_counter() - t0) * 1e3
                if not result.ok:
                    print(f"{way} measurement {i} failed: {result.status} {result.detail}", file=sys.stderr)
                    return 1
                rows.append((wall_ms, result))
                report["measurements"].append({"way": way, "index": i, "wall_ms": wall_ms, **result.to_dict()})
                print(_line(way, i, wall_ms, result), flush=True)
            report["summaries"].append(_summary(way, rows))
    print()
    for s in report["summaries"]:
        print(
            f"{s['way']}: {s['ms_per_measurement']:.1f} ms per measurement (first {s['cold_ms']:.1f} ms), "
            f"median {s['latency_median_ms']:.4f} ms, between measurements "
            f"{100 * s['between_measurements_range']:.2f}% range / {100 * s['between_measurements_cv']:.2f}% CV, "
            f"{s['reps_mean']:.0f} reps, "
            f"IQR {100 * s['within_spread_mean']:.2f}%, "
            f"CI {'-' if s['rel_ci_mean'] is None else format(100 * s['rel_ci_mean'], '.2f')}%, "
            f"GPU busy {100 * s['gpu_busy_in_job']:.0f}% of the job, {100 * s['gpu_busy_in_wall']:.0f}% of the wall"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"gpu": info, **report}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
