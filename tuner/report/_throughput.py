"""Where each tuning run's wall time went: evaluated configs per second, GPU-busy share, compile waits."""

from __future__ import annotations

import html
from typing import NamedTuple

from ._data import StudyData

__all__ = ["ThroughputInfo", "ThroughputRow", "get_throughput_info", "render_throughput"]


class ThroughputRow(NamedTuple):
    run: str  # host:pid:start
    evaluated: int
    gpus: int
    wall_s: float
    configs_per_s: float
    gpu_busy: float  # share of the GPUs' wall time spent in trial kernels
    gpu_busy_measuring: float  # share of the time inside measurements spent in trial kernels
    measure_s: float  # per GPU
    compile_wait_s: float  # per GPU
    search_s: float
    storage_s: float


class ThroughputInfo(NamedTuple):
    rows: list[ThroughputRow]


def _float(d: dict, key: str) -> float:
    value = d.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def get_throughput_info(data: StudyData) -> ThroughputInfo:
    rows = []
    for run, stats in sorted(data.runs.items(), key=lambda kv: str(kv[1].get("started", ""))):
        wall = _float(stats, "wall_s")
        evaluated = int(_float(stats, "evaluated"))
        gpus = max(1, int(_float(stats, "gpus")))  # runs stored before several GPUs shared a loop: one
        kernel, measuring = _float(stats, "kernel_s"), _float(stats, "measure_s")
        rows.append(
            ThroughputRow(
                run=run,
                evaluated=evaluated,
                gpus=gpus,
                wall_s=wall,
                configs_per_s=evaluated / wall if wall > 0 else 0.0,
                gpu_busy=kernel / (wall * gpus) if wall > 0 else 0.0,
                gpu_busy_measuring=kernel / measuring if measuring > 0 else 0.0,
                measure_s=measuring / gpus,
                compile_wait_s=_float(stats, "compile_wait_s") / gpus,
                search_s=_float(stats, "search_s"),
                storage_s=_float(stats, "storage_s"),
            )
        )
    return ThroughputInfo(rows=rows)


def render_throughput(info: ThroughputInfo) -> str | None:
    if not info.rows:
        return None
    head = (
        "run (host:process:start)",
        "GPUs",
        "evaluated",
        "wall s",
        "configs/s",
        "GPU busy",
        "GPU busy while measuring",
        "measuring s per GPU",
        "waiting for compiles s per GPU",
        "search s",
        "storage s",
    )
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(str(c))}</td>"
            for c in (
                r.run,
                r.gpus,
                r.evaluated,
                f"{r.wall_s:.0f}",
                f"{r.configs_per_s:.2f}",
                f"{100 * r.gpu_busy:.0f}%",
                f"{100 * r.gpu_busy_measuring:.0f}%",
                f"{r.measure_s:.0f}",
                f"{r.compile_wait_s:.0f}",
                f"{r.search_s:.0f}",
                f"{r.storage_s:.0f}",
            )
        )
        + "</tr>"
        for r in info.rows
    )
    return (
        '<table class="ft-table"><tr>'
        + "".join(f"<th>{html.escape(h)}</th>" for h in head)
        + "</tr>"
        + body
        + "</table>"
    )
