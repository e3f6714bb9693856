"""The dispatch table: what one family's part of a dispatch header selects from, and its JSON form.

``flashtune export --dispatch`` writes it (C++ in the header, JSON beside it); ``config="auto"``
(:mod:`tuner.serve`) reads the JSON back and selects with :meth:`DispatchTable.select`, which is
the header's ``select()`` in Python. The JSON also says which entries are their study's default, kept
because no config beat it beyond noise (``kept_default``): a call of another batch and heads then gets
its own shape's default rather than the default of the tuned shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import FlashtuneError
from ..problem import DTYPES
from ..space import Config

__all__ = ["JSON_FORMAT", "READABLE_FORMATS", "DispatchTable", "TableError", "table_from_json"]


class TableError(FlashtuneError, ValueError):
    """A dispatch table's JSON is malformed."""


#: the "format" field of the JSON written beside a dispatch header (2: each entry says whether it is a kept default)
JSON_FORMAT = "flashtune-dispatch/2"
#: the formats read back: 1 lacks ``kept_default`` (:meth:`DispatchTable.kept_default` then says None)
READABLE_FORMATS = ("flashtune-dispatch/1", JSON_FORMAT)


@dataclass(frozen=True, kw_only=True)
class DispatchTable:
    """What one family's part of a dispatch header selects from: the header's ``kDefault``,
    ``default_config`` and ``kEntries``, with :meth:`select` doing what its ``select()`` does."""

    family: str
    knobs: tuple[str, ...]  # the space's knob order: the Config struct's fields
    default: Config
    head_dim_defaults: tuple[tuple[int, Config], ...]  # head dims whose default differs from ``default``
    entries: tuple[tuple[str, int, bool, int, Config], ...]  # (dtype, head_dim, causal, seqlen, config), sorted
    #: the (dtype, head_dim, causal, seqlen) of the entries that are their study's default, kept by the re-timing;
    #: None where the table does not say (a JSON of format 1)
    kept_defaults: frozenset[tuple[str, int, bool, int]] | None = None

    def default_config(self, head_dim: int) -> Config:
        for d, config in self.head_dim_defaults:
            if d == head_dim:
                return config
        return self.default

    def covers(self, dtype: str, head_dim: int, causal: bool) -> bool:
        """Whether a tuned entry exists for (dtype, head_dim, causal): else :meth:`select` gives the default."""
        return any(e[:3] == (dtype, head_dim, causal) for e in self.entries)

    def select(self, dtype: str, head_dim: int, causal: bool, seqlen: int) -> Config:
        """Among the entries of (dtype, head_dim, causal), the first (sorted by tuned seqlen) whose tuned
        seqlen is at least ``seqlen``; past the largest, the largest; none of them: the head dim's default."""
        entry = self._selected(dtype, head_dim, causal, seqlen)
        return entry[4] if entry is not None else self.default_config(head_dim)

    def kept_default(self, dtype: str, head_dim: int, causal: bool, seqlen: int) -> bool | None:
        """Whether the entry :meth:`select` picks is its study's default kept by the re-timing (no config beat
        it beyond noise); None where no entry is picked or the table does not say (format 1)."""
        entry = self._selected(dtype, head_dim, causal, seqlen)
        if entry is None or self.kept_defaults is None:
            return None
        return entry[:4] in self.kept_defaults

    def _selected(self, dtype: str, head_dim: int, causal: bool, seqlen: int) -> tuple | None:
        largest = None
        for entry in self.entries:
            if entry[:3] != (dtype, head_dim, causal):
                continue
            if seqlen <= entry[3]:
                return entry
            largest = entry
        return largest

    def to_json(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "knobs": list(self.knobs),
            "default": self.default,
            "head_dim_defaults": [{"head_dim": d, "config": c} for d, c in self.head_dim_defaults],
            "entries": [
                {
                    "dtype": d,
                    "head_dim": h,
                    "causal": c,
                    "seqlen": n,
                    "config": config,
                    **({} if self.kept_defaults is None else {"kept_default": (d, h, c, n) in self.kept_defaults}),
                }
                for d, h, c, n, config in self.entries
            ],
        }


def _int(value: Any, what: str, where: str, *, least: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least or value >= 1 << 62:
        raise TableError(f"{where}: {what} must be an integer of at least {least}, got {str(value)[:40]!r}")
    return value


def _config(value: Any, knobs: tuple[str, ...], where: str) -> Config:
    if not isinstance(value, dict) or tuple(value) != knobs:
        raise TableError(
            f"{where}: a config must give the knobs {', '.join(knobs)} in that order, got {str(value)[:80]}"
        )
    return {k: _int(v, f"knob {k}", where, least=-(1 << 62)) for k, v in value.items()}


def table_from_json(data: Any, where: str) -> DispatchTable:
    if not isinstance(data, dict) or set(data) != {"family", "knobs", "default", "head_dim_defaults", "entries"}:
        raise TableError(f"{where}: each family needs exactly family, knobs, default, head_dim_defaults, entries")
    family, knobs = data["family"], data["knobs"]
    if not isinstance(family, str) or not family.isidentifier():
        raise TableError(f"{where}: family {str(family)[:40]!r} is not a family name")
    where = f"{where} family {family}"
    if not isinstance(knobs, list) or not knobs or not all(isinstance(k, str) for k in knobs):
        raise TableError(f"{where}: knobs must be a list of knob names")
    knobs = tuple(knobs)
    if not isinstance(data["head_dim_defaults"], list) or not isinstance(data["entries"], list):
        raise TableError(f"{where}: head_dim_defaults and entries must be lists")
    defaults = []
    for item in data["head_dim_defaults"]:
        if not isinstance(item, dict) or set(item) != {"head_dim", "config"}:
            raise TableError(f"{where}: a head_dim_defaults item needs exactly head_dim and config")
        defaults.append((_int(item["head_dim"], "head_dim", where, least=1), _config(item["config"], knobs, where)))
    entries, kept = [], []
    fields = {"dtype", "head_dim", "causal", "seqlen", "config"}
    for item in data["entries"]:
        if not isinstance(item, dict) or set(item) - {"kept_default"} != fields:
            raise TableError(
                f"{where}: an entry needs exactly dtype, head_dim, causal, seqlen and config (and kept_default)"
            )
        if not isinstance(item.get("kept_default", False), bool):
            raise TableError(f"{where}: an entry's kept_default must be true or false")
        kept.append(item.get("kept_default"))
        if not isinstance(item["dtype"], str) or item["dtype"] not in DTYPES or not isinstance(item["causal"], bool):
            raise TableError(f"{where}: an entry's dtype must be one of {sorted(DTYPES)} and causal true or false")
        entries.append(
            (
                item["dtype"],
                _int(item["head_dim"], "head_dim", where, least=1),
                item["causal"],
                _int(item["seqlen"], "seqlen", where, least=1),
                _config(item["config"], knobs, where),
            )
        )
    if [e[:4] for e in entries] != sorted(e[:4] for e in entries) or len({e[:4] for e in entries}) != len(entries):
        raise TableError(f"{where}: entries must be sorted by (dtype, head_dim, causal, seqlen), one per bucket")
    if len({k is None for k in kept}) > 1:
        raise TableError(f"{where}: kept_default must be given for every entry or for none")
    return DispatchTable(
        family=family,
        knobs=knobs,
        default=_config(data["default"], knobs, where),
        head_dim_defaults=tuple(defaults),
        entries=tuple(entries),
        kept_defaults=None
        if any(k is None for k in kept)
        else frozenset(e[:4] for e, k in zip(entries, kept, strict=True) if k),
    )
