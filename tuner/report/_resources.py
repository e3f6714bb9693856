"""TFLOPS against what ptxas reported (registers, spilled bytes) and the launch's shared memory."""

from __future__ import annotations

from typing import NamedTuple

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._data import StudyData

__all__ = ["ResourcesInfo", "get_resources_info", "plot_resources"]


class ResourcesInfo(NamedTuple):
    numbers: list[int]
    tflops: list[float]
    registers: list[int | None]
    spill_bytes: list[int | None]
    smem_bytes: list[int | None]  # dynamic shared memory from the space; static smem when unknown
    smem_label: str


def get_resources_info(data: StudyData) -> ResourcesInfo:
    rows = [r for r in data.complete if r.registers is not None]
    dynamic = any(r.smem_bytes is not None for r in rows)
    smem = [r.smem_bytes if dynamic else r.static_smem_bytes for r in rows]
    return ResourcesInfo(
        numbers=[r.number for r in rows],
        tflops=[r.tflops for r in rows],  # type: ignore[misc]
        registers=[r.registers for r in rows],
        spill_bytes=[r.spill_bytes for r in rows],
        smem_bytes=smem,
        smem_label="shared memory per CTA (KiB)" if dynamic else "static shared memory (KiB)",
    )


def plot_resources(info: ResourcesInfo) -> go.Figure | None:
    if not info.numbers:
        return None
    fig = make_subplots(
        rows=1,
        cols=3,
        shared_yaxes=True,
        horizontal_spacing=0.04,
        subplot_titles=("registers per thread", "spilled bytes (stores + loads)", info.smem_label),
    )
    smem_kib = [s / 1024 if s is not None else None for s in info.smem_bytes]
    for col, xs in enumerate((info.registers, info.spill_bytes, smem_kib), start=1):
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=info.tflops,
                mode="markers",
                showlegend=False,
                text=[f"trial {n}" for n in info.numbers],
                marker={"color": info.tflops, "colorscale": "Viridis"},
                hovertemplate="%{text}: x=%{x}, %{y:.1f} TFLOPS<extra></extra>",
            ),
            row=1,
            col=col,
        )
    fig.update_yaxes(title_text="TFLOPS", row=1, col=1)
    fig.update_layout(title="TFLOPS against resources", height=400)
    return fig
