"""The best distinct configs as a table: TFLOPS, spread, resources, speedup over the default, knobs."""

from __future__ import annotations

import html
from typing import NamedTuple

from ..space import config_key
from ._data import StudyData

__all__ = ["TopConfigRow", "TopConfigsInfo", "get_top_configs_info", "render_top_configs"]


class TopConfigRow(NamedTuple):
    rank: int | None  # None: the default config shown below the top list
    trial: int
    tflops: float
    retimed_tflops: float | None
    spread: float | None
    registers: int | None
    spill_bytes: int | None
    smem_bytes: int | None
    speedup_over_default: float | None
    is_default: bool
    is_winner: bool
    config: dict[str, int]


class TopConfigsInfo(NamedTuple):
    knobs: list[str]
    rows: list[TopConfigRow]
    default_tflops: float | None


def get_top_configs_info(data: StudyData, top: int = 10) -> TopConfigsInfo:
    retimed = {}
    winner_trial = None
    if data.winner:
        winner_trial = data.winner.get("trial")
        for c in data.winner.get("candidates") or []:
            if isinstance(c, dict) and isinstance(c.get("tflops"), (int, float)):
                retimed[c.get("trial")] = float(c["tflops"])
    default = data.default_tflops
    chosen, seen = [], set()
    for r in sorted(data.complete, key=lambda r: r.tflops, reverse=True):  # type: ignore[arg-type, return-value]
        key = config_key(r.params)
        if key not in seen:
            seen.add(key)
            chosen.append(r)
    rows = []
    listed = chosen[:top]
    ranked = len(listed)
    default_row = data.default_row
    if default_row is not None and default_row not in listed:
        listed = [*listed, default_row]
    for i, r in enumerate(listed):
        rows.append(
            TopConfigRow(
                rank=i + 1 if i < ranked else None,
                trial=r.number,
                tflops=r.tflops,  # type: ignore[arg-type]
                retimed_tflops=retimed.get(r.number),
                spread=r.spread,
                registers=r.registers,
                spill_bytes=r.spill_bytes,
                smem_bytes=r.smem_bytes if r.smem_bytes is not None else r.static_smem_bytes,
                speedup_over_default=(r.tflops / default) if default and r.tflops else None,
                is_default=r.is_default,
                is_winner=r.number == winner_trial,
                config=dict(r.params),
            )
        )
    return TopConfigsInfo(knobs=list(data.knobs), rows=rows, default_tflops=default)


def _fmt(value: object, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec)


def render_top_configs(info: TopConfigsInfo) -> str | None:
    """An HTML table (no script needed)."""
    if not info.rows:
        return None
    head = ["#", "trial", "TFLOPS", "re-timed", "spread", "regs", "spills (B)", "smem (B)", "vs default", *info.knobs]
    out = [
        '<div class="ft-scroll"><table class="ft-table"><thead><tr>'
        + "".join(f"<th>{html.escape(h)}</th>" for h in head)
        + "</tr></thead><tbody>"
    ]
    for r in info.rows:
        tags = []
        if r.is_winner:
            tags.append("winner")
        if r.is_default:
            tags.append("default")
        label = (str(r.rank) if r.rank is not None else "") + (f" ({', '.join(tags)})" if tags else "")
        cells = [
            label,
            str(r.trial),
            _fmt(r.tflops, ".1f"),
            _fmt(r.retimed_tflops, ".1f"),
            _fmt(None if r.spread is None else 100 * r.spread, ".1f") + ("%" if r.spread is not None else ""),
            _fmt(r.registers),
            _fmt(r.spill_bytes),
            _fmt(r.smem_bytes),
            _fmt(r.speedup_over_default, ".3f") + ("x" if r.speedup_over_default is not None else ""),
            *(_fmt(r.config.get(k)) for k in info.knobs),
        ]
        cls = ' class="ft-default"' if r.is_default else (' class="ft-winner"' if r.is_winner else "")
        out.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    out.append("</tbody></table></div>")
    return "\n".join(out)
