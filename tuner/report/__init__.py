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
- :mod:`._throughput` where each tuning run's wall time went

:func:`build_report` reads the studies and assembles the page (:mod:`._page`).

The report only reads the storage; it needs no GPU and works on a study copied from
another machine.
"""

from ._build import ReportError, build_report, render_report
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
