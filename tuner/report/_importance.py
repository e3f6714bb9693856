"""Parameter importances: PED-ANOVA always, fANOVA too when scikit-learn is installed."""

from __future__ import annotations

import warnings
from typing import NamedTuple

import optuna
import plotly.graph_objects as go
from optuna.distributions import CategoricalDistribution

from ._data import StudyData

__all__ = ["ImportanceInfo", "get_importance_info", "plot_importance"]

MIN_TRIALS = 2


class ImportanceInfo(NamedTuple):
    #: evaluator name -> knob -> importance (normalized to sum 1), knobs most important first
    importances: dict[str, dict[str, float]]
    n_trials: int
    notes: list[str]

    def ranking(self) -> list[str]:
        """Knobs by importance: PED-ANOVA's order, else the first evaluator's."""
        for values in self.importances.values():
            return list(values)
        return []


def _evaluators() -> tuple[dict[str, optuna.importance.BaseImportanceEvaluator], list[str]]:
    evaluators: dict[str, optuna.importance.BaseImportanceEvaluator] = {
        "PED-ANOVA": optuna.importance.PedAnovaImportanceEvaluator()
    }
    notes = []
    try:
        import sklearn  # noqa: F401
    except ImportError:
        notes.append("fANOVA is shown when scikit-learn is installed (pip install scikit-learn)")
    else:
        evaluators["fANOVA"] = optuna.importance.FanovaImportanceEvaluator(seed=0)
    return evaluators, notes


def get_importance_info(data: StudyData) -> ImportanceInfo:
    """Importances over the complete, distinct trials; knobs that never varied are left out."""
    rows = [r for r in data.complete if all(k in r.params for k in data.knobs)]
    notes: list[str] = []
    if len(rows) < MIN_TRIALS:
        note = f"importances need at least {MIN_TRIALS} complete trials; this study has {len(rows)}"
        return ImportanceInfo({}, len(rows), [note])
    varying = [k for k in data.knobs if len({r.params[k] for r in rows}) > 1]
    constant = [k for k in data.knobs if k not in varying]
    if constant:
        notes.append(f"never varied, left out: {', '.join(constant)}")
    if not varying:
        return ImportanceInfo({}, len(rows), [*notes, "no knob varied among the complete trials"])
    dists = {
        k: CategoricalDistribution(list(data.knob_values.get(k) or sorted({r.params[k] for r in rows})))
        for k in varying
    }
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "study created in memory" line
    try:
        scratch = optuna.create_study(direction="maximize")
    finally:
        optuna.logging.set_verbosity(verbosity)
    scratch.add_trials(
        [
            optuna.trial.create_trial(value=r.tflops, params={k: r.params[k] for k in varying}, distributions=dists)
            for r in rows
        ]
    )
    evaluators, more_notes = _evaluators()
    notes += more_notes
    importances: dict[str, dict[str, float]] = {}
    for name, evaluator in evaluators.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                values = optuna.importance.get_param_importances(scratch, evaluator=evaluator)
        except (ValueError, RuntimeError, ZeroDivisionError) as e:
            notes.append(f"{name} failed on this study: {e}")
            continue
        importances[name] = {k: float(v) for k, v in sorted(values.items(), key=lambda kv: kv[1], reverse=True)}
    return ImportanceInfo(importances, len(rows), notes)


def plot_importance(info: ImportanceInfo) -> go.Figure | None:
    if not info.importances:
        return None
    order = info.ranking()[::-1]  # horizontal bars: most important on top
    fig = go.Figure()
    for name, values in info.importances.items():
        fig.add_trace(
            go.Bar(
                name=name,
                x=[values.get(k, 0.0) for k in order],
                y=order,
                orientation="h",
                hovertemplate="%{y}: %{x:.3f}<extra>" + name + "</extra>",
            )
        )
    fig.update_layout(
        title=f"Knob importance for TFLOPS ({info.n_trials} complete trials)",
        barmode="group",
        xaxis_title="importance (normalized)",
        height=max(300, 60 + 40 * len(order)),
        margin={"l": 140},
    )
    return fig
