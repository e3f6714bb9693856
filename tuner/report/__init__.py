"""``flashtune report``: a self-contained HTML page about a study (and a suite of them).

One figure per module, each split Optuna-style into a data function returning a plain
NamedTuple (what the tests check) and a thin Plotly drawing function:

- :mod:`._importance` parameter importances (PED-ANOVA; fANOVA with scikit-learn)
- :mod:`._history` optimization history with the default config's line
- :mod:`._parallel` parallel coordinates
- :mod:`._contour` best TFLOPS over the two most important knobs
- :mod:`._resources` TFLOPS against registers, spills and shared memory
- :mod:`._top_configs` the top configs as a table
- :mod:`._outcomes` pruned / infeasible / failed trials and their reasons
- :mod:`._suite` winning knob values across the shapes of a suite (heat map)

The report only reads the storage; it needs no GPU and works on a study copied from
another machine.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import optuna

from ..errors import FlashtuneError
from ..problem import Problem
from ..space import load_space
from ..study import Suite
from ._contour import ContourInfo, get_contour_info, plot_contour
from ._data import StudyData, TrialRow, study_data
from ._history import HistoryInfo, get_history_info, plot_history
from ._importance import ImportanceInfo, get_importance_info, plot_importance
from ._outcomes import OutcomesInfo, get_outcomes_info, plot_outcomes, render_reasons
from ._page import STUDY_FIGURES, Section, render_page, study_sections, suite_sections
from ._parallel import ParallelInfo, get_parallel_info, plot_parallel
from ._resources import ResourcesInfo, get_resources_info, plot_resources
from ._suite import SuiteInfo, get_suite_info, plot_suite, render_suite_table
from ._top_configs import TopConfigsInfo, get_top_configs_info, render_top_configs

__all__ = [
    "STUDY_FIGURES",
    "ContourInfo",
    "HistoryInfo",
    "ImportanceInfo",
    "OutcomesInfo",
    "ParallelInfo",
    "ReportError",
    "ResourcesInfo",
    "Section",
    "StudyData",
    "SuiteInfo",
    "TopConfigsInfo",
    "TrialRow",
    "build_report",
    "get_contour_info",
    "get_history_info",
    "get_importance_info",
    "get_outcomes_info",
    "get_parallel_info",
    "get_resources_info",
    "get_suite_info",
    "get_top_configs_info",
    "plot_contour",
    "plot_history",
    "plot_importance",
    "plot_outcomes",
    "plot_parallel",
    "plot_resources",
    "plot_suite",
    "render_page",
    "render_reasons",
    "render_report",
    "render_suite_table",
    "render_top_configs",
    "study_data",
    "study_sections",
    "suite_sections",
]


def render_report(*, studies: Sequence[optuna.Study] = (), storage_url: str, suite: Suite | None = None,
                  suite_entries: Sequence[tuple[Problem, Sequence[optuna.Study]]] = ()) -> str:
    """The HTML of a report: the suite comparison page first (when ``suite`` is given), then each study."""
    sections: list[Section] = []
    if suite is not None:
        sections += suite_sections(get_suite_info(suite.name, load_space(suite.family), suite_entries))
    for i, study in enumerate(studies):
        sections += study_sections(study_data(study), storage_url, prefix="study" if i == 0 else f"study{i}")
    if suite is not None and not studies:
        title = f"flashtune report: suite {suite.name}"
    elif len(studies) == 1 and suite is None:
        title = f"flashtune report: {studies[0].study_name}"
    else:
        title = "flashtune report"
    return render_page(title, sections)


class ReportError(FlashtuneError, ValueError):
    """Nothing to report on (no study or suite given)."""


def build_report(storage_url: str | None, *, study: str | None = None,
                 suite_path: str | None = None) -> tuple[str, str]:
    """``flashtune report``: (the HTML, a file stem for it). With a suite, its storage is used unless one is given."""
    from ..study import mask_url, open_storage
    from ..study import load_flashtune_study
    from ..study import load_suite, suite_storage, suite_studies
    from ..text import printable

    if not study and not suite_path:
        raise ReportError("say what to report on: --study NAME and/or --suite FILE")
    suite = load_suite(suite_path) if suite_path else None
    url = suite_storage(suite, storage_url)
    storage = open_storage(url, create=False)
    studies = [load_flashtune_study(storage, study, url)] if study else []
    for s in studies:
        if not s.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            raise ReportError(f"study {printable(s.study_name, 120)!r} has no successful trial yet: nothing to "
                              "report; run `flashtune tune` until a config measures")
    entries: list[tuple[Problem, list[optuna.Study]]] = []
    if suite is not None:
        for entry in suite_studies(storage, suite):
            entries.append((entry.problem, [load_flashtune_study(storage, n, url) for n in entry.studies]))
        if not studies and not any(ss for _, ss in entries):
            raise ReportError(f"no study of suite {printable(suite.name, 80)} in {mask_url(url)}: nothing to report; "
                              "`flashtune tune --suite` makes them")
    text = render_report(studies=studies, storage_url=url, suite=suite, suite_entries=entries)
    stem = study if study else suite.name  # type: ignore[union-attr]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._")[:120].strip("._")
    return text, stem or "report"
