"""``flashtune export``: a finished study's winning config as a C/C++ header.

The header defines every macro the family's ``config.cuh`` reads (problem, knobs, derived
values), so the kernel builds with it in place of ``-D`` flags::

    nvcc -I kernel_src -include best.h kernel_src/sm80/flash_fwd.cu ...

Nothing read from a study database reaches C source unchecked: the knob values are
re-validated against the family's space file (and the study's space digest must still
match), every number is re-formatted from a Python ``int``/``float``, and free text
(study name, GPU name, URL) is reduced to printable ASCII inside ``//`` comments.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import optuna

from . import __version__
from . import study as st
from .devices import DeviceLimits
from .errors import FlashtuneError
from .problem import Problem, ProblemError
from .space import Config, ConfigError, Space, SpaceError, load_space
from .storage import mask_url

__all__ = [
    "ChosenConfig",
    "ExportError",
    "check_output_path",
    "choose",
    "comment_text",
    "export_study",
    "load_flashtune_study",
    "read_header",
    "render_header",
    "write_text",
]

_IDENT = re.compile(r"^[a-z][a-z0-9_]*$")
_DEFINE = re.compile(r"^\s*#\s*define\s+(FT_[A-Z0-9_]+)\s+\(?\s*(-?\d+)\s*\)?\s*(?://.*)?$")
_FAMILY_DEFINE = re.compile(r'^\s*#\s*define\s+FLASHTUNE_FAMILY\s+"([a-z][a-z0-9_]*)"\s*$')


class ExportError(FlashtuneError, ValueError):
    """A study cannot be exported (unknown, stale, empty), or the output cannot be written."""


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

    @property
    def family(self) -> str:
        return self.space.name


def load_flashtune_study(storage: optuna.storages.BaseStorage, name: str, storage_url: str) -> optuna.Study:
    """Load study ``name``; a clear :class:`ExportError` when there is none or it is not flashtune's."""
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise ExportError(f"no study named {name!r} in {mask_url(storage_url)}; "
                          "`flashtune studies` lists them") from None
    if not isinstance(study.user_attrs.get("flashtune"), dict):
        raise ExportError(f"study {name!r} was not created by flashtune")
    return study


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def choose(study: optuna.Study) -> ChosenConfig:
    """The re-timed winner (or the best trial) of ``study``, checked against today's space file.

    Raises :class:`ExportError` when the study has no successful trial, was made for a space
    whose knobs have changed, or stores values the space no longer allows.
    """
    name = study.study_name
    attrs = study.user_attrs
    made_by = attrs.get("flashtune")
    if not isinstance(made_by, dict):
        raise ExportError(f"study {name!r} was not created by flashtune")
    family = attrs.get("family")
    if not isinstance(family, str) or not _IDENT.match(family):
        raise ExportError(f"study {name!r} stores no valid kernel family ({family!r})")
    try:
        space = load_space(family)
    except SpaceError as e:
        raise ExportError(f"study {name!r} tunes family {family!r}, which cannot be loaded: {e}") from None
    if attrs.get("space_digest") != st.space_digest(space):
        raise ExportError(f"study {name!r} was tuned for other {family} knobs (space digest "
                          f"{str(attrs.get('space_digest'))[:16]!r}, today {st.space_digest(space)!r}): its stored "
                          f"values may not fit search_spaces/{family}.toml; re-tune with a new study")
    try:
        problem = Problem.from_dict(dict(attrs["problem"]))
    except (KeyError, TypeError, ValueError, ProblemError) as e:
        raise ExportError(f"study {name!r} stores a malformed problem: {e}") from None
    if not isinstance(problem.causal, bool):
        raise ExportError(f"study {name!r} stores a malformed problem: causal is {problem.causal!r}")
    gpu = attrs.get("gpu")
    try:
        device = DeviceLimits.from_info(gpu)  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError) as e:
        raise ExportError(f"study {name!r} stores malformed GPU information: {e!r}") from None
    try:
        best = st.winner(study)
    except (TypeError, ValueError) as e:
        raise ExportError(f"study {name!r} stores a malformed winner: {e}") from None
    if best is None:
        raise ExportError(f"study {name!r} has no successful trial yet: nothing to export")
    stored_config = best.get("config")
    if not isinstance(stored_config, Mapping):
        raise ExportError(f"study {name!r} stores a malformed best config: {stored_config!r:.200}")
    try:
        config = space.validate(stored_config)
    except ConfigError as e:
        raise ExportError(f"the best config of study {name!r} no longer fits the {family} space: {e}; "
                          "re-tune with a new study") from None
    reason = space.check(config, problem, device)
    if reason:
        raise ExportError(f"the best config of study {name!r} is infeasible under today's {family} space: {reason}")
    tflops = _finite(best.get("tflops"))
    speedup = _finite(best.get("speedup_over_default"))
    if speedup is None and tflops is not None:
        default = st.default_trial(study)
        default_tflops = _finite(default.value) if default is not None else None
        speedup = tflops / default_tflops if default_tflops else None
    trial = best.get("trial")
    return ChosenConfig(
        study_name=name, space=space, config=config, problem=problem, device=device,
        gpu_name=str(gpu.get("name", "?")), macros=space.macros(config, problem, device),  # type: ignore[union-attr]
        tflops=tflops, speedup_over_default=speedup, source=str(best.get("source", "?")),
        trial=trial if isinstance(trial, int) and not isinstance(trial, bool) else None,
        measured_on=str(best["date"]) if best.get("date") else None, made_by=str(made_by.get("version", "?")),
    )


# -- C text --------------------------------------------------------------------------------
def comment_text(value: object, limit: int = 200) -> str:
    """``value`` as text that is safe inside a ``//`` comment: printable ASCII, no line splice, bounded."""
    text = re.sub(r"[^\x20-\x7e]", "?", str(value))
    text = re.sub(r"\?{2,}", "?", text.replace("\\", "/"))  # no line continuation, no trigraph
    return text if len(text) <= limit else text[: limit - 3] + "..."


def guard_name(text: str) -> str:
    """An include-guard identifier built from ``text``."""
    core = re.sub(r"[^A-Z0-9]+", "_", text.upper()).strip("_")
    return f"FLASHTUNE_{core or 'CONFIG'}_H"


def _describe_rows(chosen: ChosenConfig, storage_url: str, now: datetime) -> list[tuple[str, str]]:
    p = chosen.problem
    shape = (f"batch {p.batch}, seqlen_q {p.seqlen_q}, seqlen_k {p.seqlen_k}, heads_q {p.heads_q}, "
             f"heads_kv {p.heads_kv}")
    tflops = f"{chosen.tflops:.1f}" if chosen.tflops is not None else "?"
    result = f"{tflops} TFLOPS ({'re-timed winner' if chosen.source == 'retimed' else 'best measured trial'}"
    result += f", trial {chosen.trial})" if chosen.trial is not None else ")"
    speedup = (f"{chosen.speedup_over_default:.3f}x the default config" if chosen.speedup_over_default is not None
               else "unknown (the default config was not measured)")
    arch = chosen.space.arch_string(chosen.device.arch)
    rows = [
        ("kernel family", f"{chosen.family} (kernel_src/{chosen.space.family.source})"),
        ("arch", f"sm_{arch}"),
        ("GPU", chosen.gpu_name),
        ("dtype", p.dtype),
        ("head dim", str(p.head_dim)),
        ("causal", "yes" if p.causal else "no"),
        ("shape", shape),
        ("result", result),
        ("speedup", speedup),
        ("launch", _launch_text(chosen)),
        ("study", chosen.study_name),
        ("storage", mask_url(storage_url)),
        ("tuned by", f"flashtune {chosen.made_by}" + (f", re-timed {chosen.measured_on}" if chosen.measured_on
                                                        else "")),
        ("exported", f"{now.isoformat(timespec='seconds')} by flashtune {__version__}"),
    ]
    return [(k, comment_text(v)) for k, v in rows]


def _launch_text(chosen: ChosenConfig) -> str:
    """How to launch the kernel: the space's [launch] rules, and their values for the study's shape."""
    space = chosen.space
    geometry = space.launch(chosen.config, chosen.problem, chosen.device)
    rules = ", ".join(g.text for g in space.launch_grid)
    return (f"grid ({rules}) = {geometry.grid} for this shape on {chosen.device.num_sms} SMs; "
            f"{geometry.threads} threads; {geometry.smem_bytes} B of dynamic shared memory")


def render_header(chosen: ChosenConfig, *, storage_url: str, now: datetime | None = None,
                  guard: str | None = None) -> str:
    """The header text: a comment block describing the result, then one ``#define`` per macro."""
    now = now or datetime.now(timezone.utc)
    space = chosen.space
    guard = guard or guard_name(chosen.study_name)
    width = max(len(k) for k, _ in _describe_rows(chosen, storage_url, now))
    lines = [
        f"// flashtune best config for kernel family {space.name}: generated, do not edit.",
        "//",
        *(f"//   {k:<{width}}  {v}" for k, v in _describe_rows(chosen, storage_url, now)),
        "//",
        "// Build the kernel with this header in place of -D flags:",
        (f"//   nvcc -I kernel_src -include <this header> kernel_src/{space.family.source} "
         f"-arch=sm_{space.arch_string(chosen.device.arch)} ..."),
        f"// or #include it before kernel_src/{space.family.config_header}.",
        f"#ifndef {guard}",
        f"#define {guard}",
        "",
        f'#define FLASHTUNE_FAMILY "{space.name}"',
        "",
        "// problem",
    ]
    problem_macros = chosen.problem.macros()
    lines += [f"#define {m} {int(v)}" for m, v in problem_macros.items()]
    lines.append("")
    lines.append("// knobs")
    width = max(len(k.macro) for k in space.knobs)
    for knob in space.knobs:
        lines.append(f"#define {knob.macro:<{width}} {int(chosen.config[knob.name])}  // {comment_text(knob.help)}")
    derived = [d for d in space.derived if d.macro]
    if derived:
        lines.append("")
        lines.append("// derived values (must match the knobs above; config.cuh checks them)")
        for d in derived:
            lines.append(f"#define {d.macro} {int(chosen.macros[d.macro])}  // {comment_text(d.help)}")
    lines += ["", f"#endif  // {guard}", ""]
    return "\n".join(lines)


def export_study(storage_url: str | None, name: str, *, now: datetime | None = None) -> str:
    """``flashtune export --study NAME``: the header text of study ``name``'s chosen config."""
    from .storage import DEFAULT_STORAGE, open_storage

    storage_url = storage_url or DEFAULT_STORAGE
    study = load_flashtune_study(open_storage(storage_url, create=False), name, storage_url)
    return render_header(choose(study), storage_url=storage_url, now=now)


def check_output_path(path: str | Path) -> Path:
    """``path`` if a file can be written there, else :class:`ExportError` (checked before any work is done)."""
    path = Path(path)
    if path.is_dir():
        raise ExportError(f"cannot write {path}: it is a directory; give a file name")
    if not path.parent.is_dir():
        raise ExportError(f"cannot write {path}: folder {path.parent} does not exist")
    return path


def write_text(text: str, path: str | Path) -> Path:
    """Write ``text`` to ``path`` atomically (temp file, rename); :class:`ExportError` if the path is unusable."""
    path = check_output_path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as e:
        raise ExportError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_header(path: str | Path, space: Space, problem: Problem | None = None) -> Config:
    """The knob values of a header written by :func:`render_header`, validated against ``space``; with
    ``problem``, the header must have been made for its head dim, dtype and mask (:mod:`tuner.header`)."""
    from .header import HeaderError
    from .header import read_header as read

    try:
        return read(path, space, problem)
    except HeaderError as e:
        raise ExportError(str(e)) from None
