"""`flashtune bench`: one config against PyTorch SDPA's backends and a cuBLAS GEMM, in one run."""

from __future__ import annotations

from typing import Any, TextIO

from .compile import CompileError
from .errors import UsageError
from .devices import DeviceLimits
from .jobs import MeasureSettings
from .problem import Problem
from .space import load_space
from .tune import compile_outcome, measure_job_for
from .worker import Worker

__all__ = ["run_bench", "config_for_bench"]


def config_for_bench(space, config: dict[str, int], study: str | None, storage_url: str | None,
                     head_dim: int | None = None) -> dict[str, int]:
    """An explicit config (missing knobs: the defaults for ``head_dim``), or a study's winner re-validated against the space."""
    if study:
        import optuna

        from .storage import open_storage
        from .study import winner

        loaded = optuna.load_study(study_name=study, storage=open_storage(storage_url, create=False))
        best = winner(loaded)
        if best is None:
            raise UsageError(f"study {study!r} has no successful trial")
        return space.validate(best["config"])
    return space.validate(config, partial=True, head_dim=head_dim)


def run_bench(worker: Worker, info: dict[str, Any], family: str, problem: Problem, *, config: dict[str, int],
              study: str | None, storage_url: str | None, out: TextIO,
              settings: MeasureSettings | None = None) -> list[dict[str, Any]]:
    settings = settings or MeasureSettings()
    space = load_space(family)
    device = DeviceLimits.from_info(info)
    chosen = config_for_bench(space, config, study, storage_url, problem.head_dim)
    reason = space.check(chosen, problem, device)
    if reason:
        raise UsageError(f"config is infeasible on {info['name']}: {reason}")
    outcome = compile_outcome(str(space.path), chosen, problem, device)
    if outcome.kernel is None:
        raise CompileError(outcome.reason)
    result = worker.measure(measure_job_for(space, chosen, problem, device, outcome.kernel, settings, tag="bench"))
    rows: list[dict[str, Any]] = [{"name": f"flashtune_{space.name}", "latency_ms": result.latency_ms,
                                   "tflops": result.tflops, "spread": result.spread,
                                   "detail": result.detail or f"rel err {result.rel_error:.2e}"}]
    rows += worker.call("run_peers", (problem, settings), timeout_s=600)
    ours = rows[0]["tflops"]
    print(f"{problem.slug()} on {info['name']} (sm_{device.arch}, driver {info.get('driver_version', info['driver'])}, "
          f"SM clock {info.get('sm_clock_mhz', '?')} MHz)", file=out)
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
