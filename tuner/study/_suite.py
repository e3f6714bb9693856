"""Study suites: a TOML file in ``studies/`` naming the problems one family is tuned for, in one command.

Format (``studies/h200_sweep.toml`` is an example)::

    description = "what the suite is for"        # optional
    family = "sm90"                               # a file in search_spaces/
    storage = "sqlite:///studies/h200.db"         # optional; else --storage

    [grid]                                        # every combination of the lists
    dtype = ["fp16", "bf16"]
    causal = [false, true]
    head_dim = 128
    heads = 16
    seqlen = [512, 1024, 2048]
    tokens = 16384                                # batch = tokens / seqlen (or: batch = 8)

    # [[grid]] instead of [grid]: several grids, e.g. 16 heads of 128 and 32 heads of 64

    [[problems]]                                  # and/or single problems
    dtype = "fp16"
    head_dim = 64
    batch = 4
    seqlen = 4096
    heads = 32
    kv_heads = 8

Problem keys: ``dtype``, ``head_dim``, ``causal``, ``batch`` or ``tokens``, ``seqlen``,
``seqlen_k``, ``heads``, ``kv_heads`` (the names of ``flashtune tune``'s options). In
``[grid]`` each may be a value or a list; ``[[problems]]`` entries take single values.
Problems repeated by the grid and the list are tuned once. A suite holds at most
:data:`MAX_SUITE_PROBLEMS` problems (a grid is counted before it is expanded); its file is read as
a regular file of at most 1 MiB.
"""

from __future__ import annotations

import fnmatch
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from ..errors import FlashtuneError
from ..files import FileContentError, read_toml
from ..problem import Problem, ProblemError
from ..space import SpaceError, load_space
from ..text import printable
from ._meta import StudyError, StudyMeta, is_evaluated, winner
from ._secrets import mask_url
from ._storage import DEFAULT_STORAGE

#: the most problems a suite may hold (grids counted before they are expanded)
MAX_SUITE_PROBLEMS = 10_000

__all__ = [
    "MAX_SUITE_PROBLEMS",
    "Suite",
    "SuiteError",
    "SuiteStudy",
    "describe_problem",
    "is_finished",
    "load_suite",
    "problem_order",
    "select_studies",
    "suite_storage",
    "suite_studies",
]

_PROBLEM_KEYS = ("dtype", "head_dim", "causal", "batch", "tokens", "seqlen", "seqlen_k", "heads", "kv_heads")
_INT_KEYS = {"head_dim", "batch", "tokens", "seqlen", "seqlen_k", "heads", "kv_heads"}
_TOP_KEYS = {"description", "family", "storage", "grid", "problems"}


class SuiteError(FlashtuneError, ValueError):
    """A suite file is missing, malformed, or names problems its family cannot run. The message names the file."""


@dataclass(frozen=True, kw_only=True)
class Suite:
    name: str  # the file's stem
    family: str
    storage: str | None
    description: str
    problems: tuple[Problem, ...]
    path: Path


@dataclass(frozen=True, kw_only=True)
class SuiteStudy:
    """A problem of a suite and the names of the studies in a storage that tune it (empty when none yet)."""

    problem: Problem
    studies: tuple[str, ...]


def load_suite(path: str | Path) -> Suite:
    """Read and check a suite file; every problem must be one the family supports."""
    path = Path(path)
    data = _read_toml(path)
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise SuiteError(
            f"{path}: unknown key(s) {', '.join(sorted(unknown))}; a suite has {', '.join(sorted(_TOP_KEYS))}"
        )
    family = data.get("family")
    if not isinstance(family, str):
        raise SuiteError(f'{path}: missing family = "<name of a file in search_spaces/>"')
    try:
        space = load_space(family)
    except SpaceError as e:
        raise SuiteError(f"{path}: {e}") from None
    storage = data.get("storage")
    if storage is not None and (not isinstance(storage, str) or not storage.strip()):
        raise SuiteError(f"{path}: storage must be a SQLAlchemy URL string")
    if storage is not None and not printable(storage, None) == storage:
        raise SuiteError(f"{path}: storage {mask_url(storage)!r} holds control characters; write the URL on one line")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise SuiteError(f"{path}: description must be a string")
    unique = _suite_problems(data, path)
    for p in unique:
        reason = space.supports(p)
        if reason:
            raise SuiteError(f"{path}: problem {p.slug()}: {reason}")
    return Suite(
        name=path.stem, family=family, storage=storage, description=description, problems=tuple(unique), path=path
    )


def _read_toml(path: Path) -> dict[str, Any]:
    shown = printable(path, 200)
    try:
        return read_toml(path, what="the suite file")
    except FileContentError as e:
        raise SuiteError(f"{shown}: no such suite file" if e.missing else str(e)) from None


def _suite_problems(data: Mapping[str, Any], path: Path) -> list[Problem]:
    """The problems of the suite's [grid] tables, then its [[problems]], each once, in that order."""
    problems: list[Problem] = []
    grid = data.get("grid")
    if grid is not None:
        grids = [grid] if isinstance(grid, dict) else grid
        if not isinstance(grids, list) or not grids or not all(isinstance(g, dict) for g in grids):
            raise SuiteError(f"{path}: grid must be a table ([grid]) or an array of tables ([[grid]])")
        for i, g in enumerate(grids):
            where = f"{path} [grid]" if isinstance(grid, dict) else f"{path} [[grid]] #{i + 1}"
            problems += _expand_grid(g, where, MAX_SUITE_PROBLEMS - len(problems))
    listed = data.get("problems", [])
    if not isinstance(listed, list) or not all(isinstance(p, dict) for p in listed):
        raise SuiteError(f"{path}: problems must be an array of tables ([[problems]])")
    if len(problems) + len(listed) > MAX_SUITE_PROBLEMS:
        raise SuiteError(
            f"{path}: {len(problems) + len(listed):,} problems; a suite holds at most {MAX_SUITE_PROBLEMS:,} "
            "(each is a study to tune): split it into smaller suites"
        )
    for i, entry in enumerate(listed):
        where = f"{path} [[problems]] #{i + 1}"
        lists = [k for k, v in entry.items() if isinstance(v, list)]
        if lists:
            raise SuiteError(f"{where}: {', '.join(lists)} must be single values (use [grid] for lists)")
        problems.append(_problem(entry, where))
    unique = list(dict.fromkeys(problems))
    if not unique:
        raise SuiteError(f"{path}: names no problem; add a [grid] or [[problems]]")
    return unique


def _expand_grid(grid: Mapping[str, Any], where: str, room: int = MAX_SUITE_PROBLEMS) -> list[Problem]:
    """The problems of one grid, counted before they are made: at most ``room`` of them."""
    keys = list(grid)
    axes = [v if isinstance(v, list) else [v] for v in grid.values()]
    empty = [k for k, a in zip(keys, axes) if not a]
    if empty:
        raise SuiteError(f"{where}: {', '.join(empty)} is an empty list")
    count = math.prod(len(a) for a in axes)
    if count > room:
        raise SuiteError(
            f"{where}: the grid makes {count:,} problems; a suite holds at most {MAX_SUITE_PROBLEMS:,} "
            "(each is a study to tune): split it into smaller suites"
        )
    return [_problem(dict(zip(keys, combo)), where) for combo in itertools.product(*axes)]


def _problem(entry: Mapping[str, Any], where: str) -> Problem:
    unknown = set(entry) - set(_PROBLEM_KEYS)
    if unknown:
        raise SuiteError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}; problem keys are {', '.join(_PROBLEM_KEYS)}"
        )
    for key in _INT_KEYS & set(entry):
        value = entry[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise SuiteError(f"{where}: {key} must be an integer, got {value!r}")
    if "causal" in entry and not isinstance(entry["causal"], bool):
        raise SuiteError(f"{where}: causal must be true or false, got {entry['causal']!r}")
    for key in ("head_dim", "seqlen", "heads"):
        if key not in entry:
            raise SuiteError(f"{where}: missing {key}")
    if ("batch" in entry) == ("tokens" in entry):
        raise SuiteError(f"{where}: give exactly one of batch and tokens (batch = tokens / seqlen)")
    batch = entry.get("batch")
    if batch is None:
        tokens, seqlen = entry["tokens"], entry["seqlen"]
        if seqlen <= 0 or tokens % seqlen or tokens < seqlen:
            raise SuiteError(f"{where}: tokens {tokens} is not a positive multiple of seqlen {seqlen}")
        batch = tokens // seqlen
    try:
        return Problem(
            batch=batch,
            seqlen_q=entry["seqlen"],
            seqlen_k=entry.get("seqlen_k"),
            heads_q=entry["heads"],
            heads_kv=entry.get("kv_heads"),
            head_dim=entry["head_dim"],
            dtype=entry.get("dtype", "fp16"),
            causal=entry.get("causal", False),
        )
    except ProblemError as e:
        raise SuiteError(f"{where}: {e}") from None


# -- finding studies -------------------------------------------------------------------------
def suite_storage(suite: Suite | None, storage_url: str | None) -> str:
    """The storage to use: ``--storage`` when given (not the default), else the suite's, else the default."""
    if storage_url and storage_url != DEFAULT_STORAGE:
        return storage_url
    if suite is not None and suite.storage:
        return suite.storage
    return storage_url or DEFAULT_STORAGE


def is_finished(storage: optuna.storages.BaseStorage, name: str, n_trials: int | None) -> bool:
    """Whether study ``name`` exists, holds ``n_trials`` evaluated trials and has a re-timed winner.

    Evaluated trials are counted as the tuning loop counts them against its budget: finished,
    not a static rejection, not a duplicate proposal.
    """
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return False
    try:
        won = winner(study) if StudyMeta.read(study).winner else None
    except (StudyError, TypeError, ValueError, KeyError):
        return False  # tuning it again says what is wrong with it
    if not won or won.get("source") != "retimed":  # none yet, or a faster trial came after it: re-time
        return False
    if n_trials is None:
        return False
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    finished = study.get_trials(deepcopy=False, states=states)
    return sum(1 for t in finished if is_evaluated(t)) >= n_trials


def _flashtune_studies(storage: optuna.storages.BaseStorage) -> list[StudyMeta]:
    """The metadata of every flashtune study in ``storage`` (studies with unreadable metadata are left out)."""
    out = []
    for s in optuna.get_all_study_summaries(storage, include_best_trial=False):
        try:
            out.append(StudyMeta.read(s))
        except StudyError:
            continue
    return out


def suite_studies(storage: optuna.storages.BaseStorage, suite: Suite, pattern: str | None = None) -> list[SuiteStudy]:
    """For each problem of ``suite`` (in order), the flashtune studies of its family that tune it."""
    found: dict[Problem, list[str]] = {p: [] for p in suite.problems}
    for meta in _flashtune_studies(storage):
        if meta.family != suite.family:
            continue
        if pattern is not None and not fnmatch.fnmatchcase(meta.name, pattern):
            continue
        if meta.problem in found:
            found[meta.problem].append(meta.name)
    return [SuiteStudy(problem=p, studies=tuple(sorted(names))) for p, names in found.items()]


def select_studies(
    storage: optuna.storages.BaseStorage, *, pattern: str | None = None, suite: Suite | None = None
) -> list[str]:
    """Names of flashtune studies matching a glob ``pattern`` and/or belonging to ``suite``, sorted."""
    if suite is not None:
        return sorted(name for entry in suite_studies(storage, suite, pattern) for name in entry.studies)
    if pattern is None:
        raise SuiteError("select studies with --study PATTERN (a glob such as 'sm80-*-fp16-*') or --suite FILE")
    return sorted(m.name for m in _flashtune_studies(storage) if fnmatch.fnmatchcase(m.name, pattern))


def describe_problem(problem: Problem) -> str:
    """``fp16 d128 causal N=2048 (B=8, H=16)``: a label for tables and plots."""
    kv = f"/{problem.heads_kv}" if problem.heads_kv != problem.heads_q else ""
    n = f"{problem.seqlen_q}" if problem.seqlen_k == problem.seqlen_q else f"{problem.seqlen_q}x{problem.seqlen_k}"
    return (
        f"{problem.dtype} d{problem.head_dim} {'causal' if problem.causal else 'full'} N={n} "
        f"(B={problem.batch}, H={problem.heads_q}{kv})"
    )


def problem_order(problems: Sequence[Problem]) -> list[Problem]:
    """Problems sorted for display: family axes first, then sequence length."""
    return sorted(problems, key=lambda p: (p.dtype, p.head_dim, p.causal, p.seqlen_q, p.seqlen_k, p.batch, p.heads_q))
