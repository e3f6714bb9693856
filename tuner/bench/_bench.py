"""`flashtune bench`: one config against PyTorch SDPA's backends and a cuBLAS GEMM, in one run."""

from __future__ import annotations

import dataclasses
from typing import Any, TextIO

from ..compile import CompileError, compile_outcome
from ..devices import DeviceLimits
from ..errors import UsageError
from ..gpu import MeasureSettings, measure_job_for
from ..problem import Problem
from ..run import Worker
from ..space import load_space

__all__ = ["run_bench", "study_for_bench"]


def study_for_bench(study_name: str, storage_url: str | None) -> tuple[str, Problem, dict[str, int]]:
    """A study's family, problem and winner, checked as ``flashtune export`` checks them."""
    from ..study import choose, load_flashtune_study, open_storage

    chosen = choose(load_flashtune_study(open_storage(storage_url, create=False), study_name, storage_url))
    return chosen.family, chosen.problem, chosen.config


def run_bench(
    worker: Worker,
    info: dict[str, Any],
    family: str,
    problem: Problem,
    *,
    config: dict[str, int],
    out: TextIO,
    settings: MeasureSettings | None = None,
) -> list[dict[str, Any]]:
    """Time ``config`` (every knob) of ``family`` on ``problem`` against the peers; print the table on ``out``."""
    # checked, on inputs of its own: a config must compute the right function on inputs it was not tuned on
    settings = dataclasses.replace(settings or MeasureSettings(), check=True, fresh_inputs=True)
    space = load_space(family)
    device = DeviceLimits.from_info(info)
    chosen = space.validate(config)
    reason = space.check(chosen, problem, device)
    if reason:
        raise UsageError(f"config is infeasible on {info['name']}: {reason}")
    outcome = compile_outcome(str(space.path), chosen, problem, device)
    if outcome.payload is None:
        raise CompileError(outcome.reason)
    result = worker.measure(measure_job_for(space, chosen, problem, device, outcome.payload, settings, tag="bench"))
    rows: list[dict[str, Any]] = [
        {
            "name": f"flashtune_{space.name}",
            "latency_ms": result.latency_ms,
            "tflops": result.tflops,
            "spread": result.spread,
            "detail": result.detail or (f"rel err {result.rel_error:.2e}" if result.rel_error is not None else ""),
        }
    ]
    rows += worker.peers(problem, settings, timeout_s=600)
    ours = rows[0]["tflops"]
    print(
        f"{problem.slug()} on {info['name']} (sm_{device.arch}, driver {info.get('driver_version', info['driver'])}, "
        f"SM clock {info.get('sm_clock_mhz', '?')} MHz)",
        file=out,
    )
    print("config: " + ", ".join(f"{k}={v}" for k, v in chosen.items()), file=out)
    print(f"{'kernel':<32} {'ms':>9} {'TFLOPS':>8} {'ours/x':>7}  note", file=out)
    for row in rows:
        ms = f"{row['latency_ms']:.4f}" if row["latency_ms"] else "-"
        tf = f"{row['tflops']:.1f}" if row["tflops"] else "-"
        ratio = f"{ours / row['tflops']:.3f}" if ours and row["tflops"] else "-"
        print(f"{row['name']:<32} {ms:>9} {tf:>8} {ratio:>7}  {row.get('detail', '')}", file=out)
    if not result.ok:
        raise UsageError(f"flashtune kernel failed: {result.status}: {result.detail}")
    return rows
