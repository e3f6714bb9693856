"""What happened to every trial: measured, pruned (statically infeasible, failed to compile, wrong
result, hung, crashed), failed (interrupted), duplicate; with the most frequent reasons."""

from __future__ import annotations

import html
from collections import Counter
from typing import NamedTuple

import plotly.graph_objects as go

from ._data import StudyData, TrialRow

__all__ = ["OutcomesInfo", "get_outcomes_info", "plot_outcomes", "render_reasons"]


class OutcomesInfo(NamedTuple):
    counts: dict[str, int]  # outcome -> trials, most frequent first
    reasons: list[tuple[str, int, str]]  # (outcome, trials, reason), most frequent first
    total: int


def outcome(row: TrialRow) -> str:
    if row.duplicate_of is not None:
        return "duplicate"
    if row.state == "COMPLETE":
        return "measured"
    if row.state == "PRUNED":
        return row.status or "pruned"
    if row.state == "FAIL":
        return f"failed ({row.status})" if row.status else "failed"
    return row.state.lower()  # running, waiting


def get_outcomes_info(data: StudyData, max_reasons: int = 25) -> OutcomesInfo:
    counts = Counter(outcome(r) for r in data.rows)
    reasons = Counter(
        (outcome(r), (r.reason or "").strip()[:300])
        for r in data.rows
        if r.reason and r.duplicate_of is None and r.state != "COMPLETE"
    )
    return OutcomesInfo(
        counts=dict(counts.most_common()),
        reasons=[(o, n, text) for (o, text), n in reasons.most_common(max_reasons)],
        total=len(data.rows),
    )


def plot_outcomes(info: OutcomesInfo) -> go.Figure | None:
    if not info.counts:
        return None
    names = list(info.counts)
    fig = go.Figure(
        go.Bar(
            x=names,
            y=[info.counts[n] for n in names],
            text=[info.counts[n] for n in names],
            textposition="auto",
            hovertemplate="%{x}: %{y} trials<extra></extra>",
        )
    )
    fig.update_layout(title=f"Trial outcomes ({info.total} trials)", yaxis_title="trials", height=360)
    return fig


def render_reasons(info: OutcomesInfo) -> str | None:
    if not info.reasons:
        return None
    rows = "".join(
        f'<tr><td>{html.escape(o)}</td><td>{n}</td><td class="ft-reason">{html.escape(text)}</td></tr>'
        for o, n, text in info.reasons
    )
    return (
        '<table class="ft-table"><thead><tr><th>outcome</th><th>trials</th><th>reason</th></tr></thead>'
        f"<tbody>{rows}</tbody></table>"
    )
