"""Build the report of a study (and of a suite) from the storage: the HTML and a file name for it."""

from __future__ import annotations

import re
from collections.abc import Sequence

import optuna

from ..errors import FlashtuneError
from ..problem import Problem
from ..space import load_space
from ..study import Suite, load_flashtune_study, load_suite, mask_url, open_storage, suite_storage, suite_studies
from ..text import printable
from ._data import study_data
from ._page import Section, render_page, study_sections, suite_sections
from ._suite import get_suite_info

__all__ = ["ReportError", "build_report", "render_report"]


def render_report(
    *,
    studies: Sequence[optuna.Study] = (),
    storage_url: str,
    suite: Suite | None = None,
    suite_entries: Sequence[tuple[Problem, Sequence[optuna.Study]]] = (),
) -> str:
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


def build_report(
    storage_url: str | None, *, study: str | None = None, suite_path: str | None = None
) -> tuple[str, str]:
    """``flashtune report``: (the HTML, a file stem for it). With a suite, its storage is used unless one is given."""
    if not study and not suite_path:
        raise ReportError("say what to report on: --study NAME and/or --suite FILE")
    suite = load_suite(suite_path) if suite_path else None
    url = suite_storage(suite, storage_url)
    storage = open_storage(url, create=False)
    studies = [load_flashtune_study(storage, study, url, suite_path=suite_path)] if study else []
    for s in studies:
        if not s.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            raise ReportError(
                f"study {printable(s.study_name, 120)!r} has no successful trial yet: nothing to "
                "report; run `flashtune tune` until a config measures"
            )
    entries: list[tuple[Problem, list[optuna.Study]]] = []
    if suite is not None:
        for entry in suite_studies(storage, suite):
            entries.append(
                (entry.problem, [load_flashtune_study(storage, n, url, suite_path=suite_path) for n in entry.studies])
            )
        if not studies and not any(ss for _, ss in entries):
            raise ReportError(
                f"no study of suite {printable(suite.name, 80)} in {mask_url(url)}: nothing to report; "
                "`flashtune tune --suite` makes them"
            )
    text = render_report(studies=studies, storage_url=url, suite=suite, suite_entries=entries)
    stem = study if study else suite.name  # type: ignore[union-attr]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._")[:120].strip("._")
    return text, stem or "report"
