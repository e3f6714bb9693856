"""Optimization history: TFLOPS of every measured trial, the best so far, and the default config's line."""

from __future__ import annotations

from typing import NamedTuple

import plotly.graph_objects as go

from ._data import StudyData

__all__ = ["HistoryInfo", "get_history_info", "plot_history"]


class HistoryInfo(NamedTuple):
    numbers: list[int]
    tflops: list[float]
    best_so_far: list[float]
    default_tflops: float | None  # the default config's trial
    winner_tflops: float | None  # the re-timed winner, when there is one


def get_history_info(data: StudyData) -> HistoryInfo:
    rows = sorted(data.complete, key=lambda r: r.number)
    best: list[float] = []
    for r in rows:
        best.append(max(best[-1], r.tflops) if best else r.tflops)  # type: ignore[arg-type, type-var]
    winner = data.winner.get("tflops") if data.winner else None
    return HistoryInfo(
        numbers=[r.number for r in rows],
        tflops=[r.tflops for r in rows],  # type: ignore[misc]
        best_so_far=best,
        default_tflops=data.default_tflops,
        winner_tflops=float(winner) if isinstance(winner, (int, float)) else None,
    )


def plot_history(info: HistoryInfo) -> go.Figure | None:
    if not info.numbers:
        return None
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=info.numbers,
            y=info.tflops,
            mode="markers",
            name="trial",
            hovertemplate="trial %{x}: %{y:.1f} TFLOPS<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(x=info.numbers, y=info.best_so_far, mode="lines", name="best so far", line={"shape": "hv"})
    )
    if info.default_tflops is not None:
        fig.add_hline(
            y=info.default_tflops,
            line_dash="dash",
            line_color="gray",
            annotation_text=f"default config {info.default_tflops:.1f}",
            annotation_position="bottom right",
        )
    if info.winner_tflops is not None:
        fig.add_hline(
            y=info.winner_tflops,
            line_dash="dot",
            line_color="green",
            annotation_text=f"re-timed winner {info.winner_tflops:.1f}",
            annotation_position="top left",
        )
    fig.update_layout(title="Optimization history", xaxis_title="trial", yaxis_title="TFLOPS", height=420)
    return fig
