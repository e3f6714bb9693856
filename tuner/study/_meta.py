"""Optuna studies for flashtune: naming, the metadata a study carries, resuming safely, reading results.

A study's attributes (their keys: :mod:`tuner.study._attributes`) are read in one place,
:meth:`StudyMeta.read`; whether a study may serve a config (made by flashtune, still valid for
today's space file, a successful trial) is decided in one place, :func:`choose`. A trial's
outcome is a :class:`TrialStatus`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shlex
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from .._version import __version__
from ..devices import DeviceLimits
from ..errors import FlashtuneError
from ..outcome import Status
from ..problem import Problem, ProblemError
from ..space import Config, ConfigError, Space, SpaceError, config_key, load_space
from ..text import printable
from ._attributes import (
    DUPLICATE_OF,
    FAMILY,
    GPU,
    IS_DEFAULT,
    KERNEL,
    KNOB_ENCODING,
    MADE_BY,
    MEASUREMENT,
    PROBLEM,
    RUN,
    SPACE_DIGEST,
    STATUS,
    WINNER,
)
from ._knobs import STEPS
from ._secrets import mask_url

__all__ = [
    "METRIC_NAME",
    "SCHEMA_VERSION",
    "ChosenConfig",
    "NotFlashtuneError",
    "StaleSpaceError",
    "StudyError",
    "StudyInfo",
    "StudyMeta",
    "TrialStatus",
    "choose",
    "default_study_name",
    "default_trial",
    "describe",
    "finished_by_config",
    "is_evaluated",
    "listing_hint",
    "load_flashtune_study",
    "open_study",
    "space_digest",
    "study_problem",
    "winner",
    "winner_verdict",
]

SCHEMA_VERSION = 1
#: the objective's name in Optuna's tools (``study.set_metric_names``): every trial's value is its TFLOPS
METRIC_NAME = "TFLOPS"

_FAMILY_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
# how long a racing tuner waits for the creator to finish writing a new study's attributes: while it has some
# of them (flashtune's creation is under way), and while it has none at all (it may have just begun)
_META_WAIT_S = 15.0
_EMPTY_WAIT_S = 2.0


#: What became of a trial, stored as its ``status`` user attribute: the one outcome vocabulary of compile,
#: GPU worker, tuning loop and storage (:class:`tuner.outcome.Status`; ``TrialStatus.of(trial)`` reads it).
TrialStatus = Status


#: statuses of trials that were refused or failed (every status but ok, interrupted and orphaned)
INFEASIBLE_STATUSES = tuple(
    s.value for s in TrialStatus if s not in (TrialStatus.OK, TrialStatus.INTERRUPTED, TrialStatus.ORPHANED)
)


def is_evaluated(trial: FrozenTrial) -> bool:
    """Whether a trial counts against the budget: finished (COMPLETE or PRUNED) with a status other than
    infeasible (a status this version does not know counts too), and not a duplicate proposal."""
    status = trial.user_attrs.get(STATUS)
    return (
        trial.state in (TrialState.COMPLETE, TrialState.PRUNED)
        and status is not None
        and status != TrialStatus.INFEASIBLE
        and DUPLICATE_OF not in trial.user_attrs
    )


class StudyError(FlashtuneError, RuntimeError, ValueError):
    """A study cannot be created, resumed or used as asked (not flashtune's, wrong family, problem or GPU,
    stale knobs, malformed attributes, no successful trial)."""


class NotFlashtuneError(StudyError):
    """The study was not made by flashtune (a plain Optuna study in the same storage)."""


class StaleSpaceError(StudyError):
    """The study was made for other knobs than today's space file declares."""


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


@dataclass(frozen=True, kw_only=True)
class StudyMeta:
    """What a flashtune study stores about itself, read and checked once (:meth:`read`)."""

    name: str
    version: str  # flashtune version that created the study
    schema: int
    family: str
    problem: Problem
    gpu: Mapping[str, Any]
    space_digest: str | None
    run: Mapping[str, Any] = field(default_factory=dict)
    kernel: Mapping[str, Any] = field(default_factory=dict)  # origin and source digest (none: an older study)
    winner: Mapping[str, Any] | None = None  # as stored (see :func:`winner` for the one to serve)

    @classmethod
    def read(cls, study: optuna.Study | optuna.study.StudySummary) -> StudyMeta:
        return cls.from_attrs(study.study_name, study.user_attrs)

    @classmethod
    def from_attrs(cls, name: str, attrs: Mapping[str, Any]) -> StudyMeta:
        """Raises :class:`NotFlashtuneError` for a study flashtune did not make, :class:`StudyError` for a
        flashtune study of another schema or with malformed attributes."""
        shown = printable(name, 120)
        made_by = attrs.get(MADE_BY)
        if not isinstance(made_by, dict):
            raise NotFlashtuneError(f"study {shown!r} was not created by flashtune; choose another --study name")
        schema = made_by.get("schema", 0)
        version = printable(made_by.get("version", "?"), 40)
        if isinstance(schema, bool) or not isinstance(schema, int):
            raise StudyError(f"study {shown!r} stores a malformed flashtune schema ({schema!r:.40})")
        if schema > SCHEMA_VERSION:
            raise StudyError(
                f"study {shown!r} was written by flashtune {version} (schema {schema}); this is "
                f"{__version__} (schema {SCHEMA_VERSION}): upgrade flashtune"
            )
        if schema < SCHEMA_VERSION:
            raise StudyError(
                f"study {shown!r} was written by an older flashtune ({version}); start a new study "
                "(another --study name) to tune with this version"
            )
        family = attrs.get(FAMILY)
        if not isinstance(family, str) or not _FAMILY_NAME.fullmatch(family):
            raise StudyError(f"study {shown!r} stores no valid kernel family ({printable(repr(family), 60)})")
        try:
            problem = Problem.from_dict(dict(attrs.get(PROBLEM) or {}))
        except (TypeError, ValueError, ProblemError) as e:
            raise StudyError(f"study {shown!r} stores a malformed problem: {printable(e, 160)}") from None
        gpu = attrs.get(GPU)  # checked where it is used: device() and check_resumable()
        digest = attrs.get(SPACE_DIGEST)
        run = attrs.get(RUN)
        stored_winner = attrs.get(WINNER)
        kernel = attrs.get(KERNEL)
        return cls(
            name=name,
            version=version,
            schema=schema,
            family=family,
            problem=problem,
            gpu=dict(gpu) if isinstance(gpu, dict) else {},
            space_digest=digest if isinstance(digest, str) else None,
            run=dict(run) if isinstance(run, dict) else {},
            winner=dict(stored_winner) if isinstance(stored_winner, dict) else None,
            kernel=dict(kernel) if isinstance(kernel, dict) else {},
        )

    @property
    def gpu_name(self) -> str:
        return str(self.gpu.get("name", "?"))

    def device(self) -> DeviceLimits:
        """The stored GPU's limits, or :class:`StudyError`."""
        try:
            return DeviceLimits.from_info(dict(self.gpu))
        except (KeyError, TypeError, ValueError) as e:
            raise StudyError(
                f"study {printable(self.name, 120)!r} stores malformed GPU information: {e!r:.120}"
            ) from None

    def space(self) -> Space:
        """Today's space file of the study's family, if the study was made for these very knobs; else
        :class:`StudyError` (its stored configs may not fit)."""
        shown = printable(self.name, 120)
        try:
            space = load_space(self.family)
        except SpaceError as e:
            origin = self.kernel.get("origin")
            hint = (
                f" (it came from kernel directory {printable(origin, 200)}: pass --kernels with it)"
                if isinstance(origin, str) and origin != "package"
                else ""
            )
            raise StudyError(
                f"study {shown!r} tunes family {self.family!r}, which cannot be loaded{hint}: {e}"
            ) from None
        if self.space_digest != space_digest(space):
            raise StaleSpaceError(
                f"study {shown!r} was tuned for other {self.family} knobs (space digest "
                f"{printable(self.space_digest, 16)!r}, today {space_digest(space)!r}): its stored "
                f"values may not fit search_spaces/{self.family}.toml; re-tune with a new study"
            )
        return space

    def check_resumable(self, space: Space, problem: Problem, gpu: Mapping[str, Any]) -> None:
        """Refuse to resume this study for another family, problem, GPU model or knob space."""
        shown = printable(self.name, 120)
        if self.family != space.name:
            raise StudyError(f"study {shown!r} tunes family {self.family!r}, not {space.name!r}")
        if self.problem != problem:
            raise StudyError(f"study {shown!r} tunes problem {self.problem.to_dict()}, not {problem.to_dict()}")
        if self.gpu.get("name") != gpu.get("name"):
            raise StudyError(
                f"study {shown!r} was measured on {printable(repr(self.gpu.get('name')), 60)}; timings "
                f"on {printable(repr(gpu.get('name')), 60)} do not compare: use another --study name"
            )
        self.check_sources(space)
        if self.space_digest != space_digest(space):
            raise StudyError(
                f"the knobs of {space.name} changed since study {shown!r} was created; "
                "its stored configs no longer match: start a new study (another --study name; "
                "with --suite, another --storage)"
            )

    def check_sources(self, space: Space) -> None:
        """Refuse a kernel whose sources changed since the study was created (a study made before flashtune
        recorded them cannot tell, and is not refused)."""
        stored = self.kernel.get("source_digest")
        if isinstance(stored, str) and stored != space.source_digest():
            origin = printable(self.kernel.get("origin", "?"), 200)
            raise StudyError(
                f"the sources of kernel family {space.name} changed since study {printable(self.name, 120)!r} "
                f"was created (from {origin}; source digest {printable(stored, 16)}, today "
                f"{space.source_digest()} in {space.origin}): its timings are of another kernel; start a new "
                "study (another --study name) or restore the sources"
            )


def kernel_attrs(space: Space) -> dict[str, str]:
    """What a study records about its kernel: where the family came from and the digest of its sources."""
    return {"origin": space.origin, "source_digest": space.source_digest()}


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


def _study_default(space: Space, problem: Problem, gpu: Mapping[str, Any]) -> dict[str, int]:
    """The default config a new study of ``problem`` on the GPU ``gpu`` describes starts from (the space's
    ``[[defaults]]`` rules need the device's limits; GPU information without them gets the arch's default)."""
    try:
        device = DeviceLimits.from_info(gpu)
    except (KeyError, TypeError, ValueError):
        return space.defaults(problem.head_dim, _arch(gpu))
    return space.defaults(problem=problem, device=device)


def _arch(gpu: Mapping[str, Any]) -> int | None:
    """The compute capability (x10) a study's GPU information names, or None."""
    arch = gpu.get("arch")
    return arch if isinstance(arch, int) and not isinstance(arch, bool) else None


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def default_study_name(space: Space, arch: int, gpu_name: str, problem: Problem) -> str:
    """``<family>-sm<arch>-<gpu>-<problem slug>``, e.g. ``sm80-sm90-nvidia-h200-fp16-d128-full-b8-h16-n2048``."""
    return f"{space.name}-sm{arch}-{_slug(gpu_name)}-{problem.slug()}"


# -- creating and resuming -----------------------------------------------------------------
def _study_id(storage: optuna.storages.BaseStorage, name: str) -> int | None:
    try:
        return storage.get_study_id_from_name(name)
    except KeyError:
        return None


def _stored_meta(storage: optuna.storages.BaseStorage, name: str, study_id: int) -> StudyMeta:
    """The study's metadata; while another process is still writing a new study's attributes (it has
    none of ``flashtune`` yet and no finished trial), wait for it to finish."""
    start = time.monotonic()
    while True:
        attrs = storage.get_study_user_attrs(study_id)
        try:
            return StudyMeta.from_attrs(name, attrs)
        except NotFlashtuneError:
            partial = bool(attrs) and set(attrs) <= {FAMILY, PROBLEM, GPU, SPACE_DIGEST, KERNEL, KNOB_ENCODING}
            patience = _META_WAIT_S if partial else _EMPTY_WAIT_S if not attrs else 0.0
            if time.monotonic() - start > patience or any(
                t.state.is_finished() for t in storage.get_all_trials(study_id, deepcopy=False)
            ):
                raise
        time.sleep(0.1)


def open_study(
    *,
    storage: optuna.storages.BaseStorage | str,
    name: str,
    space: Space,
    problem: Problem,
    gpu: dict[str, Any],
    sampler: optuna.samplers.BaseSampler,
) -> optuna.Study:
    """Create the study, or resume it after checking it was made for the same family, problem, GPU and space.

    A new study gets the family's default config enqueued as its first trial. Several processes may
    call this at once for the same new study: one creates it, the others load it once it is complete.
    """
    if isinstance(storage, str):
        storage = optuna.storages.get_storage(storage)
    for _ in range(5):
        study_id = _study_id(storage, name)
        if study_id is None:
            try:
                study = optuna.create_study(study_name=name, storage=storage, sampler=sampler, direction="maximize")
            except optuna.exceptions.DuplicatedStudyError:
                continue  # another process created it first: load theirs
            study.set_user_attr(FAMILY, space.name)
            study.set_user_attr(PROBLEM, problem.to_dict())
            study.set_user_attr(GPU, gpu)
            study.set_user_attr(SPACE_DIGEST, space_digest(space))
            study.set_user_attr(KERNEL, kernel_attrs(space))
            _name_for_optuna_tools(study)
            study.enqueue_trial(_study_default(space, problem, gpu), user_attrs={IS_DEFAULT: True})
            study.set_user_attr(MADE_BY, {"version": __version__, "schema": SCHEMA_VERSION})  # last: complete
            return study
        _stored_meta(storage, name, study_id).check_resumable(space, problem, gpu)
        return optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    raise StudyError(f"study {printable(name, 120)!r} was created and deleted repeatedly while opening it; rerun")


def _name_for_optuna_tools(study: optuna.Study) -> None:
    """What Optuna's tools read from a new study: the objective's name ("TFLOPS", not "Objective 0") and
    the knob encoding under which ordered knobs are stored as integers (:mod:`tuner.study._knobs`)."""
    with warnings.catch_warnings():  # set_metric_names is marked experimental: no warning for the user
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([METRIC_NAME])
    study.set_user_attr(KNOB_ENCODING, STEPS)


def study_problem(study: optuna.Study) -> Problem:
    return StudyMeta.read(study).problem


# -- results ---------------------------------------------------------------------------------
def winner(study: optuna.Study) -> dict[str, Any] | None:
    """The re-timed winner, else the best measured trial, as a plain dict.

    A trial that was not COMPLETE when the winner was re-timed (``seen_trials`` of the stored
    winner) and measured faster than the winner re-timed, by more than the re-timing's ``margin``
    (a winner stored before margins were: by anything), makes the winner stale: then the best trial
    is returned, with ``source`` saying so (re-timing again settles it).
    """
    stored = study.user_attrs.get(WINNER)
    complete = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    if stored and not isinstance(stored, dict):
        return dict(stored, source="retimed")  # malformed: raises, and the caller says so
    seen = set(stored.get("seen_trials", ())) if stored else set()
    newer = [
        t
        for t in complete
        if stored and "seen_trials" in stored and t.number not in seen and DUPLICATE_OF not in t.user_attrs
    ]  # a repeat only copies an older trial's figure
    beyond = 1 + ((_finite(stored.get("margin")) or 0.0) if stored else 0.0)
    if stored and not any(t.value > stored.get("tflops", 0.0) * beyond for t in newer):
        return dict(stored, source="retimed")
    if not complete:
        return None
    best = max(complete, key=lambda t: t.value)
    source = "best trial" if not stored else f"best trial (newer than the winner re-timed at trial {stored['trial']})"
    measurement = best.user_attrs.get(MEASUREMENT)
    return {
        "config": dict(best.params),
        "tflops": best.value,
        "trial": best.number,
        "source": source,
        "latency_ms": measurement.get("latency_ms") if isinstance(measurement, dict) else None,
    }


def winner_verdict(entry: Mapping[str, Any]) -> str | None:
    """What a re-timed winner says about the default, in words (``best``, ``export`` and the report print
    it): "no config beats the default beyond noise (±x%)" when the default was stored as the winner, the
    winner's speedup and margin when it beat the default; None for a winner stored before re-timing
    compared against the default with a margin (it says nothing about noise) or for a best trial."""
    if "beats_default" not in entry:
        return None
    beats, margin = entry.get("beats_default"), _finite(entry.get("margin"))
    if beats is None:
        return "the default config was not re-timed, so the winner was not compared with it"
    shown = f"±{margin:.1%}" if margin is not None else "±?"
    if not beats:
        closest = entry.get("challenger")
        said = f"no config beats the default beyond noise ({shown})"
        if isinstance(closest, Mapping) and _finite(closest.get("speedup_over_default")) is not None:
            said += f": the closest, trial {closest.get('trial')}, measured {closest['speedup_over_default']:.3f}x"
        return said
    speedup = _finite(entry.get("speedup_over_default"))
    lead = f"{speedup:.3f}x the default" if speedup is not None else "faster than the default"
    return f"{lead}, beyond noise ({shown})"


def default_trial(study: optuna.Study) -> FrozenTrial | None:
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.user_attrs.get(IS_DEFAULT):
            return t
    return None


@dataclass(frozen=True, kw_only=True)
class ChosenConfig:
    """A study's chosen config, re-validated against the current space; everything a header needs."""

    study_name: str
    space: Space
    config: Config
    problem: Problem
    device: DeviceLimits
    gpu_name: str
    macros: dict[str, int]
    tflops: float | None
    speedup_over_default: float | None
    source: str  # "retimed" or "best trial"
    trial: int | None
    measured_on: str | None  # date the winner was re-timed, when it was
    made_by: str  # flashtune version that created the study
    latency_ms: float | None = None
    is_default: bool = False  # the chosen config is the family's default for the study's head dim
    # the re-timing's verdict (None: a winner stored before it compared with a margin, or a best trial)
    beats_default: bool | None = None
    margin: float | None = None  # the lead over the default a win needed (relative)
    verdict: str | None = None  # :func:`winner_verdict`
    # the config of the study's default trial: what the winner was timed against (None: no default trial)
    timed_default: Config | None = None

    @property
    def family(self) -> str:
        return self.space.name

    @property
    def default_moved(self) -> bool:
        """Today's space gives the study's problem another default than the one the study measured (a default
        or a ``[[defaults]]`` rule changed since): a winner's lead over today's default is then unmeasured."""
        if self.timed_default is None:
            return False
        return dict(self.timed_default) != dict(self.space.defaults(problem=self.problem, device=self.device))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values (no NaN or infinity)."""
        return {
            "study": self.study_name,
            "family": self.family,
            "source": self.source,
            "trial": self.trial,
            "tflops": self.tflops,
            "latency_ms": self.latency_ms,
            "speedup_over_default": self.speedup_over_default,
            "is_default": self.is_default,
            "beats_default": self.beats_default,
            "margin": self.margin,
            "verdict": self.verdict,
            "config": dict(self.config),
            "timed_default": dict(self.timed_default) if self.timed_default is not None else None,
            "default_moved": self.default_moved,
            "problem": self.problem.to_dict(),
            "gpu": self.gpu_name,
            "date": self.measured_on,
        }


def listing_hint(storage_url: str | None, suite_path: str | None = None) -> str:
    """The command that lists the studies of this storage (or of this suite): the hint of every "no such
    study" message, with the ``--suite`` or ``--storage`` it needs (the password masked)."""
    if suite_path:
        return f"`flashtune studies --suite {shlex.quote(str(suite_path))}` lists them"
    return f"`flashtune studies --storage {shlex.quote(mask_url(storage_url or ''))}` lists them"


def load_flashtune_study(
    storage: optuna.storages.BaseStorage, name: str, storage_url: str, *, suite_path: str | None = None
) -> optuna.Study:
    """Load study ``name``; a clear :class:`StudyError` when there is none or it is not flashtune's
    (``suite_path``: the suite whose storage it is, for the hint)."""
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise StudyError(
            f"no study named {printable(name, 120)!r} in {mask_url(storage_url)}; "
            + listing_hint(storage_url, suite_path)
        ) from None
    StudyMeta.read(study)
    return study


def choose(study: optuna.Study) -> ChosenConfig:
    """The re-timed winner (or the best trial) of ``study``, checked against today's space file: the one
    check of "made by flashtune and still valid" that ``best``, ``export``, ``bench`` and dispatch share.

    Raises :class:`StudyError` when the study is not flashtune's, has no successful trial, was made for
    a space whose knobs have changed, stores malformed attributes or values the space no longer allows.
    """
    meta = StudyMeta.read(study)
    name = printable(meta.name, 120)
    space = meta.space()
    device = meta.device()
    try:
        best = winner(study)
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise StudyError(f"study {name!r} stores a malformed winner: {e!r:.120}") from None
    if best is None:
        raise StudyError(
            f"study {name!r} has no successful trial yet: run `flashtune tune` (or `flashtune worker "
            "--study`) until a config measures"
        )
    stored_config = best.get("config")
    if not isinstance(stored_config, Mapping):
        raise StudyError(f"study {name!r} stores a malformed best config: {printable(repr(stored_config), 120)}")
    try:
        config = space.validate(stored_config)
    except ConfigError as e:
        raise StudyError(
            f"the best config of study {name!r} no longer fits the {meta.family} space: "
            f"{printable(e, 200)}; re-tune with a new study"
        ) from None
    reason = space.check(config, meta.problem, device)
    if reason:
        raise StudyError(f"the best config of study {name!r} is infeasible under today's {meta.family} space: {reason}")
    tflops = _finite(best.get("tflops"))
    speedup = _finite(best.get("speedup_over_default"))
    if speedup is None and tflops is not None:
        default = default_trial(study)
        default_tflops = _finite(default.value) if default is not None else None
        speedup = tflops / default_tflops if default_tflops else None
    trial = best.get("trial")
    return ChosenConfig(
        study_name=meta.name,
        space=space,
        config=config,
        problem=meta.problem,
        device=device,
        gpu_name=meta.gpu_name,
        macros=space.macros(config, meta.problem, device),
        tflops=tflops,
        speedup_over_default=speedup,
        source=str(best.get("source", "?")),
        trial=trial if isinstance(trial, int) and not isinstance(trial, bool) else None,
        measured_on=str(best["date"]) if best.get("date") else None,
        made_by=meta.version,
        latency_ms=_finite(best.get("latency_ms")),
        is_default=config == space.defaults(problem=meta.problem, device=device),
        timed_default=_timed_default(study, space),
        **_verdict_fields(best),
    )


def _timed_default(study: optuna.Study, space: Space) -> Config | None:
    """The config of the study's default trial, if it has one the space still accepts."""
    trial = default_trial(study)
    if trial is None:
        return None
    try:
        return space.validate(dict(trial.params))
    except ConfigError:
        return None


def _verdict_fields(best: Mapping[str, Any]) -> dict[str, Any]:
    """The re-timing's verdict on the default, for :class:`ChosenConfig` (none for a best trial)."""
    if best.get("source") != "retimed":
        return {"beats_default": None, "margin": None, "verdict": None}
    beats = best.get("beats_default")
    return {
        "beats_default": beats if isinstance(beats, bool) else None,
        "margin": _finite(best.get("margin")),
        "verdict": winner_verdict(best),
    }


def describe(storage: optuna.storages.BaseStorage) -> list[StudyInfo]:
    """Every flashtune study in ``storage`` with its best figures (others are skipped; one with malformed
    attributes is listed with ``?`` where they cannot be read, and never hides the others)."""
    rows = []
    for s in optuna.get_all_study_summaries(storage, include_best_trial=False):
        try:
            meta: StudyMeta | None = StudyMeta.read(s)
        except NotFlashtuneError:
            continue
        except StudyError:
            meta = None
        study = optuna.load_study(study_name=s.study_name, storage=storage)
        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        values = [v for v in (_finite(t.value) for t in complete) if v is not None]
        stored_winner = meta.winner if meta else None
        rows.append(
            StudyInfo(
                name=s.study_name,
                family=meta.family if meta else str(s.user_attrs.get(FAMILY, "?")),
                problem=meta.problem.slug() if meta else "?",
                gpu=meta.gpu_name if meta else "?",
                trials=s.n_trials,
                complete=len(complete),
                best_tflops=max(values) if values else None,
                winner_tflops=_finite(stored_winner.get("tflops")) if stored_winner else None,
            )
        )
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
