"""Which kernel family a call runs: ``family="auto"`` resolved for the device, the config and the problem.

- an explicit family (a name or a space file's path) is used as given;
- ``"auto"`` with a header as ``config=``: the family the header names (``FLASHTUNE_FAMILY``);
- ``"auto"`` with ``config="auto"``: among the families of the tuned table (the user's ``tuned=``, else
  the table shipped for this GPU) that run on the device and support the head dim and dtype, the one the
  family rule prefers (:func:`tuner.space.choose_family`); a user's table none of whose families runs
  on the device is refused in one line (it was tuned for another GPU);
- otherwise the rule's family for the device and problem.
"""

from __future__ import annotations

from typing import Any

from ..problem import Problem
from ..space import AUTO_FAMILY, SpaceError, available_families, choose_family, load_space, rank_families
from ._tuned import TunedConfigs

__all__ = ["FamilyChoiceError", "resolve_family"]


class FamilyChoiceError(ValueError):
    """No family fits; the message says why (the caller raises it as its own error type)."""


def resolve_family(
    family: Any, config_kind: str, arch: int, problem: Problem, *, tuned: TunedConfigs | None, header_family=None
) -> Any:
    """The family (name or space file path) the call runs; ``header_family()`` gives a header's family."""
    if not (isinstance(family, str) and family == AUTO_FAMILY):
        return family
    if config_kind == "header":
        return header_family()
    if config_kind == "auto" and tuned is not None and tuned.tables:
        installed = set(available_families())
        spaces = [load_space(name) for name in sorted(tuned.tables) if name in installed]
        running = rank_families(arch, None, spaces)
        if not running and not tuned.shipped:
            reasons = "; ".join(s.runs_on(arch) or s.name for s in spaces) or "no installed family"
            raise FamilyChoiceError(
                f"{tuned.source} holds configs of {', '.join(sorted(tuned.tables))}, which cannot run on this "
                f"sm_{arch} device ({reasons}): tune this GPU, or pass family= to use its defaults"
            )
        fitting = rank_families(arch, problem, running)
        if fitting:
            return fitting[0].name
    try:
        return choose_family(arch, problem).name
    except SpaceError as e:
        raise FamilyChoiceError(str(e)) from None
