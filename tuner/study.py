"""Optuna studies for flashtune: naming, the metadata a study carries, resuming safely, reading results.

Study user attributes (set once, at creation):
    ``flashtune``  {"version", "schema"}          the tuner that created the study
    ``family``     kernel family name
    ``problem``    :class:`~tuner.problem.Problem` as a dict
    ``gpu``        what the GPU worker reported (name, arch, driver, clocks, ...)
    ``space_digest`` hash of the space file's knob declarations
Later:
    ``winner``     the re-timed best config (see :mod:`tuner.retime`)

Trial user attributes are named by the constants below.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from . import __version__
from .errors import FlashtuneError
from .problem import Problem
from .space import Space, config_key

__all__ = [
    "SCHEMA_VERSION",
    "StudyError",
    "StudyInfo",
    "default_study_name",
    "describe",
    "open_study",
    "space_digest",
    "study_problem",
    "winner",
]

SCHEMA_VERSION = 1

# trial user attributes
STATUS = "status"  # "ok" or why the trial is infeasible (see tuner.jobs.Status, plus compile statuses)
REASON = "reason"  # one line for people
IS_DEFAULT = "is_default"
CONFIG_KEY = "config_key"
RESOURCES = "resources"  # ptxas: registers, spills, stack, static smem
MEASUREMENT = "measurement"  # latency_ms, spread, reps, tflops, rel_error, lse_error
COMPILE = "compile"  # seconds, cached, arch
DUPLICATE_OF = "duplicate_of"
EXPLORATION = "exploration"  # drawn at random by the tuner because the search had no config to offer

WARM_START = "warm_start"  # trial: the study whose winner it was enqueued from; study: those studies (once)

# study user attributes written by each tuning run: ``throughput:<host>:<pid>:<start>`` -> tuner.tune.RunStats
THROUGHPUT_PREFIX = "throughput:"

INFEASIBLE_STATUSES = ("infeasible", "compile_error", "compile_timeout", "wrong_result", "launch_error", "timeout",
                       "crashed")


class StudyError(FlashtuneError, RuntimeError):
    """A study cannot be created or resumed as asked (wrong family, problem or GPU; newer schema)."""


@dataclass(frozen=True)
class StudyInfo:
    """One line of ``flashtune studies``."""

    name: str
    family: str
    problem: str
    gpu: str
    trials: int
    complete: int
    best_tflops: float | None
    winner_tflops: float | None


def space_digest(space: Space) -> str:
    """Hash of the knob declarations: a study's stored params only make sense for this space."""
    text = json.dumps([(k.name, k.macro, list(k.values)) for k in space.knobs])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def default_study_name(space: Space, arch: int, gpu_name: str, problem: Problem) -> str:
    """``<family>-sm<arch>-<gpu>-<problem slug>``, e.g. ``sm80-sm90-nvidia-h200-fp16-d128-full-b8-h16-n2048``."""
    return f"{space.name}-sm{arch}-{_slug(gpu_name)}-{problem.slug()}"


def open_study(*, storage: optuna.storages.BaseStorage, name: str, space: Space, problem: Problem,
               gpu: dict[str, Any], sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    """Create the study, or resume it after checking it was made for the same family, problem, GPU and space.

    A new study gets the family's default config enqueued as its first trial.
    """
    existing = {s.study_name: s for s in optuna.get_all_study_summaries(storage)}
    if name in existing:
        attrs = existing[name].user_attrs
        _check_resumable(name, attrs, space, problem, gpu)
        return optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    study = optuna.create_study(study_name=name, storage=storage, sampler=sampler, direction="maximize")
    study.set_user_attr("flashtune", {"version": __version__, "schema": SCHEMA_VERSION})
    study.set_user_attr("family", space.name)
    study.set_user_attr("problem", problem.to_dict())
    study.set_user_attr("gpu", gpu)
    study.set_user_attr("space_digest", space_digest(space))
    study.enqueue_trial(space.defaults(problem.head_dim), user_attrs={IS_DEFAULT: True})
    return study


def _check_resumable(name: str, attrs: dict[str, Any], space: Space, problem: Problem, gpu: dict[str, Any]) -> None:
    made_by = attrs.get("flashtune")
    if not isinstance(made_by, dict):
        raise StudyError(f"study {name!r} was not created by flashtune; choose another --study name")
    if made_by.get("schema", 0) > SCHEMA_VERSION:
        raise StudyError(f"study {name!r} was written by flashtune {made_by.get('version')} (schema "
                         f"{made_by.get('schema')}); this is {__version__} (schema {SCHEMA_VERSION}): upgrade flashtune")
    if made_by.get("schema", 0) < SCHEMA_VERSION:
        raise StudyError(f"study {name!r} was written by an older flashtune ({made_by.get('version')}); "
                         "start a new study (another --study name) to tune with this version")
    if attrs.get("family") != space.name:
        raise StudyError(f"study {name!r} tunes family {attrs.get('family')!r}, not {space.name!r}")
    if attrs.get("problem") != problem.to_dict():
        raise StudyError(f"study {name!r} tunes problem {attrs.get('problem')}, not {problem.to_dict()}")
    stored_gpu = (attrs.get("gpu") or {}).get("name")
    if stored_gpu != gpu.get("name"):
        raise StudyError(f"study {name!r} was measured on {stored_gpu!r}; timings on {gpu.get('name')!r} do not "
                         "compare: use another --study name")
    if attrs.get("space_digest") != space_digest(space):
        raise StudyError(f"the knobs of {space.name} changed since study {name!r} was created; "
                         "its stored configs no longer match: start a new study (another --study name; "
                         "with --suite, another --storage)")


def study_problem(study: optuna.Study) -> Problem:
    return Problem.from_dict(study.user_attrs["problem"])


def winner(study: optuna.Study) -> dict[str, Any] | None:
    """The re-timed winner, else the best measured trial, as a plain dict.

    A trial that was not COMPLETE when the winner was re-timed (``seen_trials`` of the stored
    winner) and measured faster than the winner re-timed makes the winner stale: then the best
    trial is returned, with ``source`` saying so (re-timing again settles it).
    """
    stored = study.user_attrs.get("winner")
    complete = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    if stored and not isinstance(stored, dict):
        return dict(stored, source="retimed")  # malformed: raises, and the caller says so
    seen = set(stored.get("seen_trials", ())) if stored else set()
    newer = [t for t in complete if stored and "seen_trials" in stored and t.number not in seen
             and DUPLICATE_OF not in t.user_attrs]  # a repeat only copies an older trial's figure
    if stored and not any(t.value > stored.get("tflops", 0.0) for t in newer):
        return dict(stored, source="retimed")
    if not complete:
        return None
    best = max(complete, key=lambda t: t.value)
    source = "best trial" if not stored else f"best trial (newer than the winner re-timed at trial {stored['trial']})"
    return {"config": dict(best.params), "tflops": best.value, "trial": best.number, "source": source,
            "latency_ms": best.user_attrs.get(MEASUREMENT, {}).get("latency_ms")}


def default_trial(study: optuna.Study) -> FrozenTrial | None:
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.user_attrs.get(IS_DEFAULT):
            return t
    return None


def describe(storage: optuna.storages.BaseStorage) -> list[StudyInfo]:
    """Every flashtune study in ``storage`` with its best figures (others are skipped)."""
    rows = []
    for s in optuna.get_all_study_summaries(storage, include_best_trial=True):
        if "flashtune" not in s.user_attrs:
            continue
        try:
            problem = Problem.from_dict(s.user_attrs["problem"]).slug()
        except (TypeError, ValueError, KeyError):
            problem = "?"
        study = optuna.load_study(study_name=s.study_name, storage=storage)
        trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        rows.append(StudyInfo(
            name=s.study_name, family=s.user_attrs.get("family", "?"), problem=problem,
            gpu=(s.user_attrs.get("gpu") or {}).get("name", "?"), trials=s.n_trials, complete=len(trials),
            best_tflops=s.best_trial.value if s.best_trial else None,
            winner_tflops=(s.user_attrs.get("winner") or {}).get("tflops"),
        ))
    return rows


def finished_by_config(study: optuna.Study, trials: list[FrozenTrial] | None = None) -> dict[str, FrozenTrial]:
    """Finished trials keyed by config hash (the first one of each config wins)."""
    out: dict[str, FrozenTrial] = {}
    if trials is None:
        trials = study.get_trials(deepcopy=False)
    for t in trials:
        if t.state not in (TrialState.COMPLETE, TrialState.PRUNED):
            continue
        if t.params and t.user_attrs.get(DUPLICATE_OF) is None:
            out.setdefault(config_key(t.params), t)
    return out
