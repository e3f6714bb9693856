"""A study read once into plain rows: what every figure of the report is computed from.

Reading is lenient: a report must open on a study copied from another machine, made with
another version of the space file, or still running. When today's space file no longer
matches the study, knob names and values come from the stored trials and derived values
(dynamic shared memory) are left out, with a note.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from .. import study as st
from ..devices import DeviceLimits
from ..errors import FlashtuneError
from ..problem import Problem
from ..space import Space
from ..text import printable

__all__ = ["StudyData", "TrialRow", "study_data"]


@dataclass(frozen=True, kw_only=True)
class TrialRow:
    """One trial as the report sees it."""

    number: int
    state: str  # COMPLETE, PRUNED, FAIL, RUNNING, WAITING
    status: str | None  # the trial's tuner.study.TrialStatus: ok, infeasible, compile_error, wrong_result, ...
    reason: str | None
    params: dict[str, int]
    tflops: float | None
    latency_ms: float | None
    spread: float | None
    registers: int | None
    spill_bytes: int | None  # stores + loads
    static_smem_bytes: int | None
    smem_bytes: int | None  # dynamic shared memory of the launch (from the space), when known
    is_default: bool
    duplicate_of: int | None

    @property
    def complete(self) -> bool:
        """A measured, distinct config: the rows importances, history and plots are made of."""
        return self.state == "COMPLETE" and self.tflops is not None and self.duplicate_of is None


@dataclass(frozen=True, kw_only=True)
class StudyData:
    name: str
    family: str
    problem: Problem | None
    gpu_name: str
    knobs: tuple[str, ...]
    knob_values: dict[str, tuple[int, ...]]
    knob_help: dict[str, str]
    rows: tuple[TrialRow, ...]
    winner: dict[str, Any] | None
    space: Space | None
    notes: tuple[str, ...] = field(default=())
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # tuning run -> its throughput figures

    @property
    def complete(self) -> list[TrialRow]:
        return [r for r in self.rows if r.complete]

    @property
    def default_row(self) -> TrialRow | None:
        for r in self.rows:
            if r.is_default and r.state == "COMPLETE" and r.tflops is not None:
                return r
        return None

    @property
    def default_tflops(self) -> float | None:
        row = self.default_row
        return row.tflops if row else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _int(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None else None


def _space_for(meta: st.StudyMeta) -> tuple[Space | None, str | None]:
    try:
        return meta.space(), None
    except st.StaleSpaceError:
        return None, (
            f"the knobs of {meta.family} changed since this study was made; knobs are read from the "
            "trials and derived values (dynamic shared memory) are not shown"
        )
    except st.StudyError as e:
        return None, f"the {meta.family} space cannot be used here ({e}); knobs are read from the trials"


@dataclass(frozen=True)
class _Context:
    """What the study's attributes say, as far as they can be read: enough to read its trials."""

    meta: st.StudyMeta | None
    family: str
    gpu_name: str
    space: Space | None
    device: DeviceLimits | None


def _context(study: optuna.Study, notes: list[str]) -> _Context:
    """The study's attributes, today's space file and device limits; what cannot be read adds a note."""
    try:
        meta: st.StudyMeta | None = st.StudyMeta.read(study)
    except st.StudyError as e:
        notes.append(f"the study's attributes cannot be read ({e}); knobs are read from the trials")
        return _Context(
            meta=None, family=printable(study.user_attrs.get(st.FAMILY, "?"), 64), gpu_name="?", space=None, device=None
        )
    try:
        device: DeviceLimits | None = meta.device()
    except st.StudyError:
        device = None
    space, note = _space_for(meta)
    if note:
        notes.append(note)
    return _Context(
        meta=meta, family=meta.family, gpu_name=str(dict(meta.gpu).get("name", "?")), space=space, device=device
    )


def _knobs(
    space: Space | None, trials: list[optuna.trial.FrozenTrial]
) -> tuple[tuple[str, ...], dict[str, tuple[int, ...]], dict[str, str]]:
    """(knob names, allowed values, help) from the space file, or the names and values the trials hold."""
    if space is not None:
        return (
            tuple(k.name for k in space.knobs),
            {k.name: k.values for k in space.knobs},
            {k.name: k.help for k in space.knobs},
        )
    seen: dict[str, set[int]] = {}
    for t in trials:
        for name, value in t.params.items():
            if _int(value) is not None:
                seen.setdefault(name, set()).add(int(value))
    return tuple(seen), {k: tuple(sorted(v)) for k, v in seen.items()}, {}


def _launch_smem(
    t: optuna.trial.FrozenTrial, space: Space | None, problem: Problem | None, device: DeviceLimits | None
) -> int | None:
    """The trial's dynamic shared memory, when today's space can compute it for the study's problem and device."""
    if space is None or problem is None or device is None or not t.params:
        return None
    try:
        return space.launch(space.validate(t.params), problem, device).smem_bytes
    except (FlashtuneError, ArithmeticError, KeyError, TypeError, ValueError):
        return None


def _row(t: optuna.trial.FrozenTrial, smem_bytes: int | None) -> TrialRow:
    """One trial as a :class:`TrialRow`: values of the wrong type are left out, not trusted."""
    measurement = t.user_attrs.get(st.MEASUREMENT) if isinstance(t.user_attrs.get(st.MEASUREMENT), dict) else {}
    resources = t.user_attrs.get(st.RESOURCES) if isinstance(t.user_attrs.get(st.RESOURCES), dict) else {}
    spills = [_int(resources.get(k)) for k in ("spill_store_bytes", "spill_load_bytes")]
    duplicate = t.user_attrs.get(st.DUPLICATE_OF)
    return TrialRow(
        number=t.number,
        state=t.state.name,
        status=printable(t.user_attrs[st.STATUS], 40) if st.STATUS in t.user_attrs else None,
        reason=str(t.user_attrs[st.REASON]) if st.REASON in t.user_attrs else None,
        params={k: int(v) for k, v in t.params.items() if _int(v) is not None},
        tflops=_number(t.value) if t.state == TrialState.COMPLETE else None,
        latency_ms=_number(measurement.get("latency_ms")),
        spread=_number(measurement.get("spread")),
        registers=_int(resources.get("registers")),
        spill_bytes=sum(s for s in spills if s is not None) if any(s is not None for s in spills) else None,
        static_smem_bytes=_int(resources.get("static_smem_bytes")),
        smem_bytes=smem_bytes,
        is_default=bool(t.user_attrs.get(st.IS_DEFAULT)),
        duplicate_of=_int(duplicate) if duplicate is not None else None,
    )


def _retimed_winner(study: optuna.Study, meta: st.StudyMeta | None, notes: list[str]) -> dict[str, Any] | None:
    """The stored re-timed winner, or None (with a note) when a faster trial made it stale."""
    winner = dict(meta.winner) if meta and meta.winner else None
    if winner is None:
        return None
    try:
        resolved = st.winner(study)
    except (TypeError, ValueError):
        resolved = None
    if resolved is None or resolved.get("source") != "retimed":  # stale: best/export serve another trial
        notes.append(
            f"the re-timed winner (trial {winner.get('trial')}) is stale: trial "
            f"{resolved.get('trial') if resolved else '?'} measured faster after it was re-timed; "
            "`flashtune best` and `export` serve that trial until the study is re-timed"
        )
        return None
    return winner


def study_data(study: optuna.Study) -> StudyData:
    """Read ``study`` (any state) into a :class:`StudyData`."""
    notes: list[str] = []
    context = _context(study, notes)
    problem = context.meta.problem if context.meta else None
    trials = study.get_trials(deepcopy=False)
    knobs, knob_values, knob_help = _knobs(context.space, trials)
    rows = tuple(_row(t, _launch_smem(t, context.space, problem, context.device)) for t in trials)
    winner = _retimed_winner(study, context.meta, notes)
    runs = {
        k[len(st.THROUGHPUT_PREFIX) :]: v
        for k, v in study.user_attrs.items()
        if k.startswith(st.THROUGHPUT_PREFIX) and isinstance(v, dict)
    }
    return StudyData(
        name=study.study_name,
        family=context.family,
        problem=problem,
        gpu_name=context.gpu_name,
        knobs=knobs,
        knob_values=knob_values,
        knob_help=knob_help,
        rows=rows,
        winner=winner,
        space=context.space,
        notes=tuple(notes),
        runs=runs,
    )
