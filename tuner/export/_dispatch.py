"""``flashtune export --dispatch``: one C++17 header that picks a tuned config for each runtime shape.

Each study contributes the config of one (kernel family, dtype, head dim, causal, sequence
length). Per family the header holds a ``Config`` struct (one ``int`` field per knob, in the
order of the space file), the family's defaults, a table of tuned entries and a ``constexpr``
selection function::

    namespace flashtune::sm80 {
    struct Config { int block_m; int block_n; ... };
    inline constexpr Config kDefault = {...};
    constexpr Config default_config(int head_dim) noexcept;  // kDefault, or the head dim's own default
    inline constexpr Entry kEntries[] = {{DType::fp16, 128, false, 512, {...}}, ...};
    constexpr Config select(DType dtype, int head_dim, bool causal, int seqlen) noexcept;
    }

Selection: among the entries of the same (dtype, head_dim, causal), the one with the smallest
tuned sequence length at or above ``seqlen``; above the largest tuned length, the largest.
A (dtype, head_dim, causal) that no study covered gets ``default_config(head_dim)``, the
family's default config from its space file for that head dim (valid for every problem the
family supports). Every value is re-validated through :func:`tuner.study.choose` before it is
written.

The same tables go into a JSON file beside the header (:func:`render_dispatch_json`), which
``tuner.attention(config="auto", tuned="dispatch.json")`` reads (:mod:`tuner.serve`); a
:class:`DispatchTable` (:mod:`._table`) holds one family's table, and its ``select`` is the
header's ``select()`` in Python.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .._version import __version__
from ..devices import DeviceLimits
from ..errors import FlashtuneError
from ..problem import DTYPES, Problem
from ..space import Space, load_space
from ..text import printable
from ._header import comment_text
from ._table import JSON_FORMAT, DispatchTable

if TYPE_CHECKING:  # tuner.study imports Optuna: it is imported where a study is read, not with this package
    from ..study import ChosenConfig

__all__ = [
    "DispatchEntry",
    "DispatchError",
    "DispatchFamily",
    "DispatchSelection",
    "build_dispatch",
    "collect_dispatch",
    "export_dispatch",
    "moved_defaults",
    "render_dispatch",
    "render_dispatch_json",
]


class DispatchError(FlashtuneError, ValueError):
    """The studies cannot share one dispatch header (two for the same bucket, different GPUs, none)."""


@dataclass(frozen=True, kw_only=True)
class DispatchEntry:
    dtype: str
    head_dim: int
    causal: bool
    seqlen: int  # the tuned seqlen_q: the bucket's upper bound
    chosen: ChosenConfig

    @property
    def key(self) -> tuple[str, int, bool, int]:
        return (self.dtype, self.head_dim, self.causal, self.seqlen)


@dataclass(frozen=True, kw_only=True)
class DispatchFamily:
    space: Space
    entries: tuple[DispatchEntry, ...]  # sorted by (dtype, head_dim, causal, seqlen)

    def table(self) -> DispatchTable:
        space = self.space
        plain = space.defaults()
        return DispatchTable(
            family=space.name,
            knobs=tuple(k.name for k in space.knobs),
            default=plain,
            head_dim_defaults=tuple(
                (int(d), space.defaults(d)) for d in space.family.head_dims if space.defaults(d) != plain
            ),
            entries=tuple(
                (e.dtype, int(e.head_dim), bool(e.causal), int(e.seqlen), dict(e.chosen.config)) for e in self.entries
            ),
            kept_defaults=frozenset(e.key for e in self.entries if e.chosen.beats_default is False),
        )


def build_dispatch(chosen: Sequence[ChosenConfig]) -> list[DispatchFamily]:
    """Group configs by family and bucket; refuse two configs for one bucket, or studies of different GPUs."""
    if not chosen:
        raise DispatchError("no study to put in a dispatch header")
    gpus = sorted({c.gpu_name for c in chosen})
    if len(gpus) > 1:
        raise DispatchError(
            f"the studies were measured on different GPUs ({', '.join(gpus)}); one dispatch header "
            "is for one GPU: select studies of one GPU with --study PATTERN"
        )
    by_family: dict[str, dict[tuple[str, int, bool, int], DispatchEntry]] = {}
    spaces: dict[str, Space] = {}
    for c in chosen:
        p = c.problem
        entry = DispatchEntry(dtype=p.dtype, head_dim=p.head_dim, causal=bool(p.causal), seqlen=p.seqlen_q, chosen=c)
        table = by_family.setdefault(c.family, {})
        spaces[c.family] = c.space
        if entry.key in table:
            other = table[entry.key].chosen.study_name
            raise DispatchError(
                f"studies {other!r} and {c.study_name!r} both tune {c.family} {p.dtype} head_dim "
                f"{p.head_dim} {'causal' if p.causal else 'non-causal'} seqlen {p.seqlen_q}; "
                "select one of them (--study PATTERN)"
            )
        table[entry.key] = entry
    return [
        DispatchFamily(space=spaces[f], entries=tuple(sorted(t.values(), key=lambda e: e.key)))
        for f, t in sorted(by_family.items())
    ]


def _cpp_bool(value: bool) -> str:
    return "true" if value else "false"


def _config_literal(space: Space, config: dict[str, int]) -> str:
    return "{" + ", ".join(str(int(config[k.name])) for k in space.knobs) + "}"


def _render_types(space: Space, table: DispatchTable) -> list[str]:
    """The family's ``Config`` and ``Entry`` structs and its default configs."""
    return [
        "struct Config {",
        *(f"  int {k.name};  // {k.macro}: {comment_text(k.help)}" for k in space.knobs),
        "};",
        "",
        "constexpr bool operator==(const Config& a, const Config& b) noexcept {",
        "  return " + " && ".join(f"a.{k.name} == b.{k.name}" for k in space.knobs) + ";",
        "}",
        "constexpr bool operator!=(const Config& a, const Config& b) noexcept { return !(a == b); }",
        "",
        "struct Entry {",
        "  DType dtype;",
        "  int head_dim;",
        "  bool causal;",
        "  int seqlen;  // the tuned query length: upper bound of this entry's bucket",
        "  Config config;",
        "};",
        "",
        (
            f"// The family's default config (search_spaces/{space.name}.toml): the fallback for shapes no study "
            "covered."
        ),
        f"inline constexpr Config kDefault = {_config_literal(space, table.default)};",
        "",
        "// The default for a head dim: kDefault, unless the space file gives that head dim its own.",
        "constexpr Config default_config(int head_dim) noexcept {",
        *(
            f"  if (head_dim == {int(d)}) return Config{_config_literal(space, config)};"
            for d, config in table.head_dim_defaults
        ),
        "  return kDefault;",
        "}",
    ]


def _render_entries(fam: DispatchFamily, table: DispatchTable) -> list[str]:
    """``kEntries``: one line per tuned config, after a comment naming its study and what it measured."""
    lines = [
        "// Tuned configs, sorted by (dtype, head_dim, causal, seqlen).",
        "inline constexpr Entry kEntries[] = {",
    ]
    for e, (_, _, _, _, config) in zip(fam.entries, table.entries, strict=True):
        c = e.chosen
        tflops = f"{c.tflops:.1f} TFLOPS" if c.tflops is not None else "? TFLOPS"
        speedup = f", {c.speedup_over_default:.2f}x default" if c.speedup_over_default is not None else ""
        if c.beats_default is False:  # the re-timing kept the default
            speedup = f", the default: {comment_text(c.verdict.replace('±', '+-') if c.verdict else '', 120)}"
        lines.append(
            f"    // study {comment_text(c.study_name, 120)}: {tflops}{speedup}, "
            f"batch {c.problem.batch} heads {c.problem.heads_q}/{c.problem.heads_kv} "
            f"seqlen_k {c.problem.seqlen_k}"
        )
        lines.append(
            f"    {{DType::{e.dtype}, {int(e.head_dim)}, {_cpp_bool(e.causal)}, {int(e.seqlen)}, "
            f"{_config_literal(fam.space, config)}}},"
        )
    lines += [
        "};",
        "inline constexpr int kNumEntries = static_cast<int>(sizeof(kEntries) / sizeof(kEntries[0]));",
    ]
    return lines


#: ``select()``, the same for every family: the bucket rule of :meth:`DispatchTable.select`
_SELECT = (
    "// The config for a runtime shape: among entries of the same (dtype, head_dim, causal), the one",
    "// with the smallest tuned seqlen >= seqlen; above the largest tuned seqlen, the largest one;",
    "// default_config(head_dim) when no entry has this (dtype, head_dim, causal). seqlen is the",
    "// query length.",
    "constexpr Config select(DType dtype, int head_dim, bool causal, int seqlen) noexcept {",
    "  const Entry* largest = nullptr;",
    "  for (int i = 0; i < kNumEntries; ++i) {",
    "    const Entry& e = kEntries[i];",
    "    if (e.dtype != dtype || e.head_dim != head_dim || e.causal != causal) continue;",
    "    if (seqlen <= e.seqlen) return e.config;",
    "    largest = &e;",
    "  }",
    "  return largest != nullptr ? largest->config : default_config(head_dim);",
    "}",
)


def _render_family(fam: DispatchFamily) -> list[str]:
    """One family's namespace: its types and defaults, its tuned entries and ``select()``."""
    space = fam.space
    table = fam.table()
    return [
        f"// ---- family {space.name}: {comment_text(space.family.description, 160)}",
        f"namespace {space.name} {{",
        "",
        *_render_types(space, table),
        "",
        *_render_entries(fam, table),
        "",
        *_SELECT,
        "",
        f"}}  // namespace {space.name}",
    ]


def render_dispatch(
    families: Sequence[DispatchFamily],
    *,
    storage_url: str,
    sources: str = "",
    not_covered: Sequence[str] = (),
    now: datetime | None = None,
    guard: str = "FLASHTUNE_DISPATCH_H",
) -> str:
    """The dispatch header text (C++17). ``sources`` says how the studies were selected."""
    from ..study import mask_url

    now = now or datetime.now(UTC)
    entries = [e for f in families for e in f.entries]
    gpu = entries[0].chosen.gpu_name if entries else "?"
    lines = [
        "// flashtune dispatch header: tuned kernel configs per shape. Generated, do not edit. C++17.",
        "//",
        f"//   GPU       {comment_text(gpu)}",
        f"//   families  {', '.join(f.space.name for f in families)}",
        f"//   studies   {len(entries)}" + (f" ({comment_text(sources)})" if sources else ""),
        f"//   storage   {comment_text(mask_url(storage_url))}",
        f"//   exported  {now.isoformat(timespec='seconds')} by flashtune {__version__}",
        "//",
        "// Usage: flashtune::<family>::select(dtype, head_dim, causal, seqlen_q) returns the Config of",
        "// the bucket the shape falls in; build the kernel with FT_<KNOB>=config.<knob> (the Config",
        "// fields are the knobs of search_spaces/<family>.toml in order, their macros in the comments).",
        "// Buckets: a tuned entry serves every seqlen_q up to its own, down to the next smaller",
        "// tuned length; lengths above the largest tuned one use the largest one's config.",
        "// Fallback: a (dtype, head_dim, causal) that no study covered gets <family>::default_config,",
        "// the family's default config for that head dim (check that the family supports that",
        "// head_dim and dtype).",
    ]
    if not_covered:
        lines.append("// Not covered (no study, or one left out; the default config is used):")
        lines += [f"//   {comment_text(n)}" for n in not_covered]
    lines += [
        f"#ifndef {guard}",
        f"#define {guard}",
        "",
        "namespace flashtune {",
        "",
        "#ifndef FLASHTUNE_DTYPE_DEFINED",
        "#define FLASHTUNE_DTYPE_DEFINED",
        "enum class DType : int { " + ", ".join(f"{d} = {i}" for i, d in enumerate(DTYPES)) + " };",
        "#endif",
        "",
    ]
    for fam in families:
        lines += _render_family(fam)
        lines.append("")
    lines += ["}  // namespace flashtune", "", f"#endif  // {guard}", ""]
    return "\n".join(lines)


def render_dispatch_json(
    families: Sequence[DispatchFamily],
    *,
    storage_url: str,
    sources: str = "",
    not_covered: Sequence[str] = (),
    now: datetime | None = None,
) -> str:
    """The JSON written beside the dispatch header: the same tables, for ``config="auto"`` (:mod:`tuner.serve`)."""
    from ..study import mask_url

    now = now or datetime.now(UTC)
    entries = [e for f in families for e in f.entries]
    studies = [
        {
            "family": f.space.name,
            "dtype": e.dtype,
            "head_dim": e.head_dim,
            "causal": e.causal,
            "seqlen": e.seqlen,
            "study": e.chosen.study_name,
            "tflops": e.chosen.tflops,
            "speedup_over_default": e.chosen.speedup_over_default,
            # what the winner was timed against, at which problem: :func:`moved_defaults` re-derives it
            "problem": e.chosen.problem.to_dict(),
            "timed_default": dict(e.chosen.timed_default) if e.chosen.timed_default is not None else None,
        }
        for f in families
        for e in f.entries
    ]
    document = {
        "format": JSON_FORMAT,
        "generator": f"flashtune {__version__}",
        "exported": now.isoformat(timespec="seconds"),
        "gpu": entries[0].chosen.gpu_name if entries else "",
        "storage": mask_url(storage_url),
        "sources": sources,
        "not_covered": list(not_covered),
        "families": [f.table().to_json() for f in families],
        "studies": studies,  # what each entry was measured at; not read by tuner.attention
    }
    return json.dumps(document, indent=1, allow_nan=False) + "\n"


@dataclass(frozen=True, kw_only=True)
class DispatchSelection:
    """The studies ``export --dispatch`` puts in a header, and what it says about the rest."""

    families: list[DispatchFamily]
    storage_url: str
    sources: str
    not_covered: list[str]

    @property
    def masked_url(self) -> str:
        from ..study import mask_url

        return mask_url(self.storage_url)

    @property
    def gpu(self) -> str:
        return next((e.chosen.gpu_name for f in self.families for e in f.entries), "")

    def header(self, now: datetime | None = None) -> str:
        return render_dispatch(
            self.families, storage_url=self.storage_url, sources=self.sources, not_covered=self.not_covered, now=now
        )

    def json(self, now: datetime | None = None) -> str:
        return render_dispatch_json(
            self.families, storage_url=self.storage_url, sources=self.sources, not_covered=self.not_covered, now=now
        )


def collect_dispatch(
    storage_url: str | None, *, pattern: str | None = None, suite_path: str | None = None, log=None
) -> DispatchSelection:
    """The studies a glob ``pattern`` and/or a suite select, each checked through :func:`tuner.study.choose`.

    With a suite, its ``storage`` is used unless ``storage_url`` is given; suite problems without
    a study, and selected studies that cannot be exported (no successful trial yet, knobs changed
    since), are listed in ``not_covered`` (their shapes get the default config) and on ``log``.
    """
    import sys

    from ..study import (
        StudyError,
        choose,
        listing_hint,
        load_flashtune_study,
        load_suite,
        mask_url,
        open_storage,
        select_studies,
        suite_storage,
        suite_studies,
    )

    suite = load_suite(suite_path) if suite_path else None
    storage_url = suite_storage(suite, storage_url)
    storage = open_storage(storage_url, create=False)
    names = select_studies(storage, pattern=pattern, suite=suite)
    if not names:
        what = f"pattern {pattern!r}"
        if suite:
            what = f"suite {suite_path}" + (f" and {what}" if pattern else "")
        raise DispatchError(
            f"no flashtune study in {mask_url(storage_url)} matches {what}; " + listing_hint(storage_url, suite_path)
        )
    not_covered = []
    if suite is not None:
        not_covered = [e.problem.slug() for e in suite_studies(storage, suite, pattern) if not e.studies]
        for slug in not_covered:
            print(
                f"flashtune export: warning: suite problem {slug} has no study yet; the default config covers it",
                file=log or sys.stderr,
            )
    chosen, left_out = [], []
    for name in names:  # a study still running or made for other knobs is left out, not fatal
        try:
            chosen.append(choose(load_flashtune_study(storage, name, storage_url, suite_path=suite_path)))
        except StudyError as e:
            left_out.append(f"{name} left out: {e}")
            print(f"flashtune export: warning: study {printable(name, 120)} left out: {e}", file=log or sys.stderr)
    if not chosen:
        raise DispatchError(f"none of the {len(names)} selected studies can be exported; first: {left_out[0]}")
    not_covered += left_out
    _warn_of_moved_defaults(chosen, log or sys.stderr)
    sources = f"suite {suite.name}" if suite else ""
    if pattern:
        sources += (", " if sources else "") + f"pattern {pattern}"
    return DispatchSelection(
        families=build_dispatch(chosen), storage_url=storage_url, sources=sources, not_covered=not_covered
    )


def _warn_of_moved_defaults(chosen: Sequence[ChosenConfig], log) -> None:
    """A warning on ``log`` for each winner timed against a default that today's space no longer gives (a study
    that kept its default is served the call's own default, so it needs none)."""
    for c in chosen:
        if c.default_moved and c.beats_default is not False and not c.is_default:
            name = printable(c.study_name, 120)
            print(
                f"flashtune export: warning: study {name} was timed against a default that today's space no "
                "longer gives its problem (a default or rule changed since), so its winner's lead over today's "
                f"default is unmeasured: `flashtune bench --study {name}` times both, or tune the shape again",
                file=log,
            )


def export_dispatch(
    storage_url: str | None,
    *,
    pattern: str | None = None,
    suite_path: str | None = None,
    now: datetime | None = None,
    log=None,
) -> str:
    """``flashtune export --dispatch``: the header over the studies a glob ``pattern`` and/or a suite select
    (:func:`collect_dispatch`)."""
    return collect_dispatch(storage_url, pattern=pattern, suite_path=suite_path, log=log).header(now)


def moved_defaults(document: Mapping[str, Any], device: DeviceLimits) -> list[str]:
    """The winners of a dispatch JSON (``document``, parsed) whose study was timed against another default than
    today's space gives the study's problem on ``device``: each a line naming the study and the knobs that moved.

    A kept default is left out (a call of its bucket gets its own default with today's rules). So is a record
    from before the JSON said what its study was timed against (no ``timed_default``).
    """
    kept = {
        (f["family"], e["dtype"], e["head_dim"], e["causal"], e["seqlen"])
        for f in document.get("families", ())
        for e in f.get("entries", ())
        if e.get("kept_default")
    }
    moved = []
    for record in document.get("studies", ()):
        key = (record["family"], record["dtype"], record["head_dim"], record["causal"], record["seqlen"])
        timed = record.get("timed_default")
        if key in kept or timed is None or record.get("problem") is None:
            continue
        today = load_space(record["family"]).defaults(problem=Problem.from_dict(record["problem"]), device=device)
        changed = sorted(k for k in today if timed.get(k) != today[k])
        if changed:
            knobs = ", ".join(f"{k} {timed.get(k)} -> {today[k]}" for k in changed)
            moved.append(f"{record['study']}: its winner was timed against a default that has moved ({knobs})")
    return moved
