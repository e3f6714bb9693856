"""The two most important knobs against each other: best TFLOPS per pair of values (a slice for one knob)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import plotly.graph_objects as go

from ._data import StudyData

__all__ = ["ContourInfo", "get_contour_info", "plot_contour"]


class ContourInfo(NamedTuple):
    x_knob: str | None
    y_knob: str | None  # None: a slice of x_knob alone
    x_values: list[int]
    y_values: list[int]
    best: list[list[float | None]]  # [y][x] best TFLOPS among trials with those values; None: not measured
    counts: list[list[int]]  # [y][x] measured trials
    points: list[tuple[int, float]]  # slice: (x value, TFLOPS) of every trial


def get_contour_info(data: StudyData, ranking: Sequence[str] = ()) -> ContourInfo:
    """``ranking``: knobs, most important first (importances); by default the knobs that varied most."""
    rows = [r for r in data.complete if all(k in r.params for k in data.knobs)]
    varying = [k for k in data.knobs if len({r.params[k] for r in rows}) > 1]
    order = [k for k in ranking if k in varying] + sorted(
        (k for k in varying if k not in ranking), key=lambda k: -len({r.params[k] for r in rows})
    )
    if not order:
        return ContourInfo(None, None, [], [], [], [], [])
    x = order[0]
    x_values = sorted({r.params[x] for r in rows})
    if len(order) == 1:
        return ContourInfo(x, None, x_values, [], [], [], [(r.params[x], r.tflops) for r in rows])  # type: ignore[misc]
    y = order[1]
    y_values = sorted({r.params[y] for r in rows})
    best: list[list[float | None]] = [[None] * len(x_values) for _ in y_values]
    counts = [[0] * len(x_values) for _ in y_values]
    for r in rows:
        i, j = y_values.index(r.params[y]), x_values.index(r.params[x])
        counts[i][j] += 1
        current = best[i][j]
        best[i][j] = r.tflops if current is None else max(current, r.tflops)  # type: ignore[type-var]
    return ContourInfo(x, y, x_values, y_values, best, counts, [])


def plot_contour(info: ContourInfo) -> go.Figure | None:
    if info.x_knob is None:
        return None
    if info.y_knob is None:
        fig = go.Figure(
            go.Scatter(
                x=[p[0] for p in info.points],
                y=[p[1] for p in info.points],
                mode="markers",
                hovertemplate=f"{info.x_knob}=%{{x}}: %{{y:.1f}} TFLOPS<extra></extra>",
            )
        )
        fig.update_layout(
            title=f"TFLOPS against {info.x_knob}",
            xaxis_title=info.x_knob,
            yaxis_title="TFLOPS",
            xaxis={"type": "category"},
            height=420,
        )
        return fig
    text = [
        [f"{v:.1f}<br>n={n}" if v is not None else "" for v, n in zip(row, nrow)]
        for row, nrow in zip(info.best, info.counts)
    ]
    fig = go.Figure(
        go.Heatmap(
            x=[str(v) for v in info.x_values],
            y=[str(v) for v in info.y_values],
            z=info.best,
            text=text,
            texttemplate="%{text}",
            colorscale="Viridis",
            colorbar={"title": {"text": "best TFLOPS"}},
            hovertemplate=f"{info.x_knob}=%{{x}}, {info.y_knob}=%{{y}}: %{{z:.1f}} TFLOPS<extra></extra>",
        )
    )
    fig.update_layout(
        title=f"Best TFLOPS over the two most important knobs: {info.x_knob} x {info.y_knob}",
        xaxis_title=info.x_knob,
        yaxis_title=info.y_knob,
        xaxis={"type": "category"},
        yaxis={"type": "category"},
        height=460,
    )
    return fig
