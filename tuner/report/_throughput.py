"""Where each tuning run's wall time went: evaluated configs per second, GPU-busy share, compile waits."""

from __future__ import annotations

import html
from typing import NamedTuple

from ._data import StudyData

__all__ = ["ThroughputInfo", "ThroughputRow", "get_throughput_info", "render_throughput"]


class ThroughputRow(NamedTuple):
    run: str  # host:pid:start
    evaluated: int
    wall_s: float
    configs_per_s: float
    gpu_busy: float  # share of the wall time the GPU spent in trial kernels
    measure_s: float
    compile_wait_s: float
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
        rows.append(ThroughputRow(run=run, evaluated=evaluated, wall_s=wall,
                                  configs_per_s=evaluated / wall if wall > 0 else 0.0,
                                  gpu_busy=_float(stats, "kernel_s") / wall if wall > 0 else 0.0,
                                  measure_s=_float(stats, "measure_s"), compile_wait_s=_float(stats, "compile_wait_s"),
                                  search_s=_float(stats, "search_s"), storage_s=_float(stats, "storage_s")))
    return ThroughputInfo(rows=rows)


def render_throughput(info: ThroughputInfo) -> str | None:
    if not info.rows:
        return None
    head = ("run (host:process:start)", "evaluated", "wall s", "configs/s", "GPU busy", "measuring s",
            "waiting for compiles s", "search s", "storage s")
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
            r.run, r.evaluated, f"{r.wall_s:.0f}", f"{r.configs_per_s:.2f}", f"{100 * r.gpu_busy:.0f}%",
            f"{r.measure_s:.0f}", f"{r.compile_wait_s:.0f}", f"{r.search_s:.0f}", f"{r.storage_s:.0f}")) + "</tr>"
        for r in info.rows)
    return ('<table class="ft-table"><tr>' + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
            + body + "</table>")
