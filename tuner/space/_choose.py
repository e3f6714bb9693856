"""``family="auto"``: the kernel family a device runs fastest, by one stated rule over the space files.

The rule (README, "Kernel families"): among the installed families (``search_spaces/*.toml``) that
run on the device (:meth:`Space.runs_on`: ``min_arch`` at most the device's compute capability,
exactly it for an arch-specific build such as ``arch_suffix = "a"``) and, when a problem is given,
support its head dim and dtype (:meth:`Space.supports`), take the most specialised one:

1. the highest ``min_arch`` (a kernel written for a newer architecture uses its instructions);
2. then an arch-specific build (``arch_suffix``) before a portable one;
3. then the family name, so the choice never depends on the order files are listed in.

On an H200 (sm_90) that is ``sm90`` for head dims 64/128/256, on an A100 or an sm_120 GPU ``sm80``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from ..problem import Problem
from ._space import Space, SpaceError, available_families, load_space

__all__ = ["AUTO_FAMILY", "choose_family", "family_preference", "rank_families"]

#: the family argument that asks for this rule (a space file may not be named so)
AUTO_FAMILY = "auto"


def family_preference(space: Space) -> tuple:
    """The sort key of the rule: smaller is preferred."""
    return (-space.family.min_arch, 0 if space.family.arch_suffix else 1, space.name)


@functools.cache
def _installed(names: tuple[str, ...]) -> tuple[Space, ...]:
    return tuple(load_space(n) for n in names)


def rank_families(arch: int, problem: Problem | None = None, among: Iterable[Space] | None = None) -> list[Space]:
    """The families (``among``, default the installed ones) that run on sm_``arch`` and support ``problem``,
    most preferred first."""
    spaces = list(among) if among is not None else list(_installed(tuple(available_families())))
    fits = [s for s in spaces if s.runs_on(arch) is None and (problem is None or s.supports(problem) is None)]
    return sorted(fits, key=family_preference)


def choose_family(arch: int, problem: Problem | None = None, among: Iterable[Space] | None = None) -> Space:
    """The family the rule picks for sm_``arch`` (and ``problem``); :class:`SpaceError` naming why each
    family was passed over when none fits."""
    spaces = list(among) if among is not None else list(_installed(tuple(available_families())))
    ranked = rank_families(arch, problem, spaces)
    if ranked:
        return ranked[0]
    reasons = [s.runs_on(arch) or (s.supports(problem) if problem is not None else None) or s.name for s in spaces]
    what = f" for head dim {problem.head_dim} {problem.dtype}" if problem is not None else ""
    raise SpaceError(
        f"no kernel family runs on sm_{arch}{what}: {'; '.join(reasons) or 'no space files installed'}; "
        "pass family= (or --family) with a space file that does"
    )
