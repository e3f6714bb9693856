"""Parallel coordinates: one axis per knob plus TFLOPS, one line per measured config."""

from __future__ import annotations

from typing import NamedTuple

import plotly.graph_objects as go

from ._data import StudyData

__all__ = ["ParallelInfo", "get_parallel_info", "plot_parallel"]


class ParallelInfo(NamedTuple):
    knobs: list[str]
    columns: dict[str, list[int]]  # knob -> value per trial
    tick_values: dict[str, list[int]]  # knob -> the values the space allows
    tflops: list[float]
    numbers: list[int]


def get_parallel_info(data: StudyData) -> ParallelInfo:
    rows = [r for r in data.complete if all(k in r.params for k in data.knobs)]
    knobs = list(data.knobs)
    return ParallelInfo(
        knobs=knobs,
        columns={k: [r.params[k] for r in rows] for k in knobs},
        tick_values={k: list(data.knob_values.get(k, ())) for k in knobs},
        tflops=[r.tflops for r in rows],
        numbers=[r.number for r in rows],
    )  # type: ignore[misc]


def plot_parallel(info: ParallelInfo) -> go.Figure | None:
    if not info.tflops:
        return None
    dims = []
    for k in info.knobs:
        ticks = info.tick_values[k] or sorted(set(info.columns[k]))
        dims.append(
            {
                "label": k,
                "values": info.columns[k],
                "tickvals": ticks,
                "range": [min(ticks), max(ticks)] if ticks else None,
            }
        )
    dims.append({"label": "TFLOPS", "values": info.tflops})
    fig = go.Figure(
        go.Parcoords(
            line={
                "color": info.tflops,
                "colorscale": "Viridis",
                "showscale": True,
                "colorbar": {"title": {"text": "TFLOPS"}},
            },
            dimensions=dims,
        )
    )
    fig.update_layout(
        title=f"Parallel coordinates ({len(info.tflops)} measured configs)", height=460, margin={"l": 60, "r": 60}
    )
    return fig
