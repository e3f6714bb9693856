"""Assemble the report: one self-contained HTML file (plotly.js inlined once, no server, works offline)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import NamedTuple

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from .._version import __version__
from ..study import describe_problem, mask_url, winner_verdict
from ._contour import get_contour_info, plot_contour
from ._data import StudyData
from ._history import get_history_info, plot_history
from ._importance import get_importance_info, plot_importance
from ._outcomes import get_outcomes_info, plot_outcomes, render_reasons
from ._parallel import get_parallel_info, plot_parallel
from ._resources import get_resources_info, plot_resources
from ._suite import SuiteInfo, plot_suite, render_suite_table
from ._throughput import get_throughput_info, render_throughput
from ._top_configs import get_top_configs_info, render_top_configs

__all__ = ["STUDY_FIGURES", "Section", "render_page", "study_sections", "suite_sections"]

#: section name -> heading, in page order; sections marked True hold a Plotly figure
STUDY_FIGURES = {
    "importance": ("Knob importance", True),
    "history": ("Optimization history", True),
    "parallel": ("Parallel coordinates", True),
    "contour": ("The two most important knobs", True),
    "resources": ("TFLOPS against registers, spills and shared memory", True),
    "top-configs": ("Top configs", False),
    "outcomes": ("Pruned, infeasible and failed trials", True),
    "throughput": ("Throughput of the tuning runs", False),
}


class Section(NamedTuple):
    id: str
    title: str
    body: str  # HTML


def _figure(fig: go.Figure | None, div_id: str, empty: str) -> str:
    if fig is None:
        return f'<p class="ft-note">{html.escape(empty)}</p>'
    return fig.to_html(
        full_html=False, include_plotlyjs=False, div_id=div_id, config={"displaylogo": False, "responsive": True}
    )


def _notes(notes: Sequence[str]) -> str:
    return "".join(f'<p class="ft-note">{html.escape(n)}</p>' for n in notes)


def _summary(data: StudyData, storage_url: str) -> str:
    p = data.problem
    winner = data.winner or {}
    best = max((r.tflops for r in data.complete), default=None)  # type: ignore[type-var]
    rows = [
        ("study", data.name),
        ("kernel family", data.family),
        ("GPU", data.gpu_name),
        ("problem", describe_problem(p) if p else "?"),
        ("trials", f"{len(data.rows)} ({len(data.complete)} measured distinct configs)"),
        ("best measured", f"{best:.1f} TFLOPS" if best is not None else "-"),
        ("default config", f"{data.default_tflops:.1f} TFLOPS" if data.default_tflops is not None else "not measured"),
    ]
    if isinstance(winner.get("tflops"), (int, float)):
        rows.append(("re-timed winner", _winner_text(winner)))
    rows.append(("storage", mask_url(storage_url)))
    return (
        '<table class="ft-summary">'
        + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
        + "</table>"
    )


def _winner_text(winner: dict) -> str:
    """The summary's line on the re-timed winner: its figure, and the re-timing's verdict on the default
    (a winner stored before verdicts were: its speedup alone)."""
    verdict = winner_verdict(winner)
    figure = f"{winner['tflops']:.1f} TFLOPS, trial {winner.get('trial')}"
    if winner.get("beats_default") is False:
        return f"the default config ({figure}): {verdict}"
    if verdict:
        return f"{figure}, {verdict}"
    speedup = winner.get("speedup_over_default")
    return figure + (f", {speedup:.3f}x the default" if isinstance(speedup, (int, float)) else "")


def study_sections(data: StudyData, storage_url: str, *, prefix: str = "study") -> list[Section]:
    """The sections of one study's page, each with its id ``<prefix>-<figure>``."""
    importance = get_importance_info(data)
    outcomes = get_outcomes_info(data)
    bodies = {
        "importance": _figure(plot_importance(importance), f"{prefix}-importance-plot", "no importance to show")
        + _notes(importance.notes),
        "history": _figure(plot_history(get_history_info(data)), f"{prefix}-history-plot", "no measured trial yet"),
        "parallel": _figure(plot_parallel(get_parallel_info(data)), f"{prefix}-parallel-plot", "no measured trial yet"),
        "contour": _figure(
            plot_contour(get_contour_info(data, importance.ranking())),
            f"{prefix}-contour-plot",
            "needs measured trials in which a knob varied",
        ),
        "resources": _figure(
            plot_resources(get_resources_info(data)),
            f"{prefix}-resources-plot",
            "no measured trial with a ptxas report",
        ),
        "top-configs": render_top_configs(get_top_configs_info(data)) or '<p class="ft-note">no measured trial yet</p>',
        "outcomes": _figure(plot_outcomes(outcomes), f"{prefix}-outcomes-plot", "no trial yet")
        + (render_reasons(outcomes) or ""),
        "throughput": render_throughput(get_throughput_info(data))
        or '<p class="ft-note">no tuning run has recorded its throughput yet</p>',
    }
    head = Section(f"{prefix}-summary", f"Study {data.name}", _summary(data, storage_url) + _notes(data.notes))
    return [head] + [Section(f"{prefix}-{key}", title, bodies[key]) for key, (title, _) in STUDY_FIGURES.items()]


def suite_sections(info: SuiteInfo) -> list[Section]:
    body = _figure(plot_suite(info), "suite-heatmap-plot", "the suite names no problem")
    body += render_suite_table(info) or ""
    return [Section("suite", f"Suite {info.name}: winning configs across shapes", body)]


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 0 2rem 3rem; color: #222; }
nav { position: sticky; top: 0; background: #fff; padding: .5rem 0; border-bottom: 1px solid #ddd; z-index: 10; }
nav a { margin-right: 1rem; }
section { margin-top: 2rem; }
.ft-scroll { overflow-x: auto; }
.ft-table, .ft-summary { border-collapse: collapse; font-size: .9rem; }
.ft-table th, .ft-table td, .ft-summary th, .ft-summary td { border: 1px solid #ddd; padding: .25rem .5rem; }
.ft-table th, .ft-summary th { background: #f4f4f4; text-align: left; }
.ft-table td { text-align: right; }
.ft-table td.ft-reason { text-align: left; font-family: monospace; }
tr.ft-winner { background: #e8f6e8; } tr.ft-default { background: #f2f2f2; }
.ft-note { color: #666; font-style: italic; }
#ft-errors { color: #a00; white-space: pre-wrap; border: 1px solid #a00; padding: .5rem; }
"""

# Collects script errors (also from plotly.js) so that people and the headless-browser test see them.
_ERROR_COLLECTOR = """
window.ftErrors = [];
window.addEventListener("error", function (e) { window.ftErrors.push(String(e.message || e)); });
window.addEventListener("unhandledrejection", function (e) {
  window.ftErrors.push("unhandled rejection: " + String(e.reason)); });
(function () { var original = console.error; console.error = function () {
  window.ftErrors.push(Array.prototype.map.call(arguments, String).join(" "));
  return original.apply(console, arguments); }; })();
"""

_ERROR_REPORT = """
window.addEventListener("load", function () { setTimeout(function () {
  var box = document.getElementById("ft-errors");
  if (window.ftErrors.length) {
    box.hidden = false; box.textContent = "Script errors:\\n" + window.ftErrors.join("\\n"); }
  document.body.setAttribute("data-ft-errors", String(window.ftErrors.length));
  document.body.setAttribute("data-ft-rendered", String(document.querySelectorAll(".plot-container").length));
}, 0); });
"""


def render_page(title: str, sections: Sequence[Section], *, now: datetime | None = None) -> str:
    """The whole HTML document."""
    now = now or datetime.now(UTC)
    nav = "".join(f'<a href="#{s.id}">{html.escape(s.title)}</a>' for s in sections)
    body = "\n".join(f'<section id="{s.id}"><h2>{html.escape(s.title)}</h2>\n{s.body}\n</section>' for s in sections)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="generator" content="flashtune {html.escape(__version__)}">
<title>{html.escape(title)}</title>
<style>{_STYLE}</style>
<script>{_ERROR_COLLECTOR}</script>
<script type="text/javascript">{get_plotlyjs()}</script>
</head>
<body>
<h1>{html.escape(title)}</h1>
<p class="ft-note">generated {now.isoformat(timespec="seconds")} by flashtune {html.escape(__version__)};
open the same storage in optuna-dashboard for interactive browsing</p>
<div id="ft-errors" hidden></div>
<nav>{nav}</nav>
{body}
<script>{_ERROR_REPORT}</script>
</body>
</html>
"""
