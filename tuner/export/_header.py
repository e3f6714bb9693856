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

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from .._version import __version__
from ..problem import Problem
from ..space import Config, Space

if TYPE_CHECKING:  # tuner.study imports Optuna: it is imported where a study is read, not with this package
    from ..study import ChosenConfig

__all__ = ["comment_text", "export_study", "guard_name", "read_header", "render_header"]


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
    from ..study import mask_url

    p = chosen.problem
    shape = f"batch {p.batch}, seqlen_q {p.seqlen_q}, seqlen_k {p.seqlen_k}, heads_q {p.heads_q}, heads_kv {p.heads_kv}"
    tflops = f"{chosen.tflops:.1f}" if chosen.tflops is not None else "?"
    what = "re-timed winner" if chosen.source == "retimed" else "best measured trial"
    if chosen.beats_default is False:
        what = "the default config, kept by the re-timing"
    result = f"{tflops} TFLOPS ({what}" + (f", trial {chosen.trial})" if chosen.trial is not None else ")")
    speedup = (
        f"{chosen.speedup_over_default:.3f}x the default config"
        if chosen.speedup_over_default is not None
        else "unknown (the default config was not measured)"
    )
    if chosen.verdict:  # the re-timing's word on the default, with its margin (ASCII: a C comment)
        speedup = chosen.verdict.replace("±", "+-")
    arch = chosen.space.arch_string(chosen.device.arch)
    rows = [
        ("kernel family", f"{chosen.family} ({_sources(chosen.space)}/{chosen.space.family.source})"),
        ("arch", f"sm_{arch}"),
        ("GPU", chosen.gpu_name),
        ("dtype", p.dtype),
        ("head dim", str(p.head_dim)),
        ("causal", "yes" if p.causal else "no"),
        ("shape", shape),
        ("result", result),
        ("speedup", speedup),
        ("launch", _launch_text(chosen)),
        *_tile_counter_rows(chosen),
        *_split_workspace_rows(chosen),
        ("study", chosen.study_name),
        ("storage", mask_url(storage_url)),
        (
            "tuned by",
            f"flashtune {chosen.made_by}" + (f", re-timed {chosen.measured_on}" if chosen.measured_on else ""),
        ),
        ("exported", f"{now.isoformat(timespec='seconds')} by flashtune {__version__}"),
    ]
    return [(k, comment_text(v)) for k, v in rows]


def _sources(space) -> str:
    """Where the family's sources are: kernel_src (flashtune's), else the user's kernel directory."""
    return "kernel_src" if space.origin == "package" else comment_text(space.origin)


def _launch_text(chosen: ChosenConfig) -> str:
    """How to launch the kernel: the space's [launch] rules, and their values for the study's shape."""
    space = chosen.space
    geometry = space.launch(chosen.config, chosen.problem, chosen.device)
    rules = ", ".join(g.text for g in space.launch_grid)
    return (
        f"grid ({rules}) = {geometry.grid} for this shape on {chosen.device.num_sms} SMs; "
        f"{geometry.threads} threads; {geometry.smem_bytes} B of dynamic shared memory"
    )


def _tile_counter_rows(chosen: ChosenConfig) -> list[tuple[str, str]]:
    """A row for a kernel that reads a tile counter (the space's [launch.abi] tile_counter): what to pass."""
    geometry = chosen.space.launch(chosen.config, chosen.problem, chosen.device)
    if not geometry.abi.get("tile_counter"):
        return []
    return [
        (
            "tile counter",
            f"ABI {chosen.space.family.abi}: pass tile_counter, 8 zeroed bytes per stream, kept for every "
            "launch on it (the kernel leaves them zero; kernel_src/README.md)",
        )
    ]


def _split_workspace_rows(chosen: ChosenConfig) -> list[tuple[str, str]]:
    """Rows for a split-KV kernel (the space's [launch.abi] split_counter_bytes is not 0): the two buffers to pass,
    their sizes for the study's shape and the rules that size them for others."""
    space = chosen.space
    geometry = space.launch(chosen.config, chosen.problem, chosen.device)
    if not geometry.abi.get("split_counter_bytes"):
        return []
    launch_rules = {name: expr.text for name, expr in space.launch_abi}
    derived = {d.name: d.expr.text for d in space.derived}

    def rule(name: str) -> str:  # a [launch.abi] entry that names a derived value: that value's expression
        text = launch_rules[name]
        return derived.get(text, text)

    return [
        (
            "split-KV",
            f"ABI {space.family.abi}: pass split_counters, {geometry.abi['split_counter_bytes']} B zeroed once per "
            "stream (the kernel leaves them zero), and split_partials, "
            f"{geometry.abi['split_partial_bytes']} B, both for this shape; kernel_src/README.md",
        ),
        ("split counters", f"bytes = {rule('split_counter_bytes')}"),
        ("split partials", f"bytes = {rule('split_partial_bytes')}"),
    ]


def render_header(
    chosen: ChosenConfig, *, storage_url: str, now: datetime | None = None, guard: str | None = None
) -> str:
    """The header text: a comment block describing the result, then one ``#define`` per macro."""
    now = now or datetime.now(UTC)
    space = chosen.space
    guard = guard or guard_name(chosen.study_name)
    width = max(len(k) for k, _ in _describe_rows(chosen, storage_url, now))
    lines = [
        f"// flashtune best config for kernel family {space.name}: generated, do not edit.",
        *(
            ["// This is the family's DEFAULT config: no tuned config beat it beyond the re-timing's noise."]
            if chosen.beats_default is False
            else []
        ),
        "//",
        *(f"//   {k:<{width}}  {v}" for k, v in _describe_rows(chosen, storage_url, now)),
        "//",
        "// Build the kernel with this header in place of -D flags:",
        (
            f"//   nvcc -I {_sources(space)} -include <this header> {_sources(space)}/{space.family.source} "
            f"-arch=sm_{space.arch_string(chosen.device.arch)} ..."
        ),
        f"// or #include it before {_sources(space)}/{space.family.config_header}.",
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
    from ..study import DEFAULT_STORAGE, choose, load_flashtune_study, open_storage

    storage_url = storage_url or DEFAULT_STORAGE
    study = load_flashtune_study(open_storage(storage_url, create=False), name, storage_url)
    return render_header(choose(study), storage_url=storage_url, now=now)


def read_header(path: str | Path, space: Space, problem: Problem | None = None) -> Config:
    """The knob values of a header written by :func:`render_header`, validated against ``space``; with
    ``problem``, the header must have been made for its head dim, dtype and mask (:mod:`._read_header`).
    A header that cannot be read or does not fit raises :class:`tuner.study.StudyError`, as a study that
    cannot be exported does."""
    from ._read_header import HeaderError
    from ._read_header import read_header as read

    try:
        return read(path, space, problem)
    except HeaderError as e:
        from ..study import StudyError

        raise StudyError(str(e)) from None
