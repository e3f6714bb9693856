"""Across shapes: the winning value of each knob for every study of a suite, as a heat map.

Each column is one problem (shape) of the suite, each row a knob; the colour is the position
of the winning value among the knob's allowed values (low to high), the text the value itself.
Winners are re-validated like an export (:func:`tuner.study.choose`); a study that cannot be
exported (stale space, no successful trial) keeps an empty column and its reason is listed.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import NamedTuple

import optuna
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..problem import Problem
from ..space import Space
from ..study import StudyError, choose, describe_problem

__all__ = ["SuiteColumn", "SuiteInfo", "get_suite_info", "plot_suite", "render_suite_table"]


class SuiteColumn(NamedTuple):
    label: str
    problem: Problem
    study: str | None
    config: dict[str, int] | None
    tflops: float | None
    speedup_over_default: float | None
    note: str  # why there is no config ("" when there is one)


class SuiteInfo(NamedTuple):
    name: str
    family: str
    knobs: list[str]
    knob_values: dict[str, tuple[int, ...]]
    columns: list[SuiteColumn]

    def position(self, knob: str, value: int | None) -> float | None:
        """``value``'s place among the knob's values, 0 (smallest) .. 1 (largest)."""
        values = self.knob_values.get(knob, ())
        if value is None or value not in values:
            return None
        ordered = sorted(values)
        return ordered.index(value) / (len(ordered) - 1) if len(ordered) > 1 else 0.5


def get_suite_info(name: str, space: Space, entries: Sequence[tuple[Problem, Sequence[optuna.Study]]]) -> SuiteInfo:
    """``entries``: each suite problem with the loaded studies that tune it (none: not tuned yet)."""
    columns: list[SuiteColumn] = []
    for problem, studies in entries:
        label = describe_problem(problem)
        if not studies:
            columns.append(SuiteColumn(label, problem, None, None, None, None, "no study yet"))
            continue
        for study in studies:
            col_label = label if len(studies) == 1 else f"{label} [{study.study_name}]"
            try:
                chosen = choose(study)
            except StudyError as e:
                columns.append(SuiteColumn(col_label, problem, study.study_name, None, None, None, str(e)))
                continue
            columns.append(
                SuiteColumn(
                    col_label,
                    problem,
                    study.study_name,
                    dict(chosen.config),
                    chosen.tflops,
                    chosen.speedup_over_default,
                    "",
                )
            )
    return SuiteInfo(
        name=name,
        family=space.name,
        knobs=[k.name for k in space.knobs],
        knob_values={k.name: k.values for k in space.knobs},
        columns=columns,
    )


def plot_suite(info: SuiteInfo) -> go.Figure | None:
    if not info.columns:
        return None
    labels = [c.label for c in info.columns]
    z = [[info.position(k, c.config.get(k) if c.config else None) for c in info.columns] for k in info.knobs]
    text = [[str(c.config[k]) if c.config and k in c.config else "" for c in info.columns] for k in info.knobs]
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        row_heights=[0.7, 0.3],
        subplot_titles=("winning value of each knob (colour: low to high among its values)", "TFLOPS of the winner"),
    )
    fig.add_trace(
        go.Heatmap(
            x=labels,
            y=info.knobs,
            z=z,
            text=text,
            texttemplate="%{text}",
            zmin=0,
            zmax=1,
            colorscale="Cividis",
            showscale=False,
            hoverongaps=False,
            hovertemplate="%{x}<br>%{y} = %{text}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Bar(
            x=labels,
            y=[c.tflops for c in info.columns],
            showlegend=False,
            text=[f"{c.speedup_over_default:.2f}x" if c.speedup_over_default else "" for c in info.columns],
            hovertemplate="%{x}: %{y:.1f} TFLOPS (%{text} the default)<extra></extra>",
        ),
        row=2,
        col=1,
    )
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_yaxes(title_text="TFLOPS", row=2, col=1)
    fig.update_layout(
        title=f"Suite {info.name}: winning {info.family} configs across shapes",
        height=max(520, 260 + 38 * len(info.knobs)),
        margin={"b": 160},
    )
    return fig


def render_suite_table(info: SuiteInfo) -> str | None:
    if not info.columns:
        return None
    head = ["shape", "study", "TFLOPS", "vs default", "note"]
    rows = []
    for c in info.columns:
        cells = [
            c.label,
            c.study or "-",
            f"{c.tflops:.1f}" if c.tflops is not None else "-",
            f"{c.speedup_over_default:.3f}x" if c.speedup_over_default is not None else "-",
            c.note,
        ]
        rows.append("<tr>" + "".join(f"<td>{html.escape(x)}</td>" for x in cells) + "</tr>")
    return (
        '<table class="ft-table"><thead><tr>'
        + "".join(f"<th>{h}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )
