"""Partial configs made whole: the knobs a user gives, the others at their defaults or, where those cannot
run with the given ones, at the feasible values nearest them.

``persistent=0`` alone on sm90 at head dim 128 takes the default ``scheduler=1``, which orders the units
of persistent CTAs only; :func:`complete` moves it to 0 and says so in :attr:`Completion.note`. Nearest
means, in this order: the fewest defaults moved; the smallest distance (steps along an ordered knob's
values, 1 for another value of a category knob); the moved knobs earliest in the space file; their
values earliest in its lists. The search moves only knobs that a failed check reads (:meth:`Space.reads`):
first those the defaults fail, then also those that the candidates' own failures read, until no knob is
added; it evaluates at most ``MAX_COMPLETION_CHECKS`` configs (about 0.1 ms each).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

from ..devices import DeviceLimits, limits_for_arch
from ..problem import Problem
from ._space import DEVICE_NAMES, Completion, Config, ConfigError, Knob, Space

__all__ = ["MAX_COMPLETION_CHECKS", "complete", "conflicts"]

MAX_COMPLETION_CHECKS = 20_000
MAX_LEVEL = 50 * MAX_COMPLETION_CHECKS  # candidates of one count of moved knobs ranked at once (then checked in order)


def complete(space: Space, config: Mapping[str, Any], problem: Problem, device: DeviceLimits) -> Completion:
    """``config``'s knobs (never changed) and the others at their defaults for ``problem``'s head dim and
    ``device``'s arch, or at the feasible values nearest them (the module's rule) where the defaults cannot
    run beside the given knobs. :class:`ConfigError` when no completion runs: it names the checks that the
    given knobs fail by themselves, else every check the defaults fail."""
    base = space.validate(config, partial=True, head_dim=problem.head_dim, arch=device.arch)
    failures = space.failures(base, problem, device)
    if not failures:
        return Completion(base)
    free = [k for k in space.knobs if k.name not in config]
    free_names = {k.name for k in free}
    given = _items(base, [k for k in base if k in config])
    stuck = [reason for reason, reads in failures if not reads & free_names]
    where = f"{problem.slug()} on {device.name or f'sm_{device.arch}'}"
    if stuck:  # a check that reads no free knob fails whatever they are
        knobs = {k.name for k in space.knobs}
        if all(not reads & knobs for reason, reads in failures if reason in stuck):  # the problem or the device
            raise ConfigError(f"{space.name} cannot run {where}: {'; '.join(stuck)}")
        raise ConfigError(
            f"{space.name}: {given} cannot run {where}: {'; '.join(stuck)}; change the given knobs (no value of "
            "the others mends it)"
        )
    found, exhausted = _nearest(space, base, free, failures, problem, device)
    if found is None:
        searched = f"the {MAX_COMPLETION_CHECKS:,} nearest completions" if exhausted else "any completion"
        raise ConfigError(
            f"{space.name}: {given or 'the defaults'} cannot run {where} with the defaults of the other knobs "
            f"({'; '.join(r for r, _ in failures)}), "
            f"nor with {searched} of the other knobs; give more knobs, or change the given ones"
        )
    moved = tuple((k.name, base[k.name], found[k.name]) for k in free if found[k.name] != base[k.name])
    names = [name for name, _, _ in moved]
    note = (
        f"{space.name}: the default {_items(base, names)} cannot run {where}{f' with {given}' if given else ''} "
        f"({'; '.join(r for r, _ in failures)}); took {_items(found, names)}, the nearest completion that runs"
    )
    return Completion(found, moved, note)


def conflicts(space: Space, config: Mapping[str, Any], problem: Problem) -> list[str]:
    """The checks that ``config``'s own knobs fail for ``problem`` whatever the others and the device are:
    those that read no other knob and no device field (evaluated on the family's nominal device, which they
    do not read)."""
    base = space.validate(config, partial=True, head_dim=problem.head_dim)
    nominal = limits_for_arch(space.family.min_arch)
    return [
        reason
        for reason, reads in space.failures(base, problem, nominal)
        if reads and not reads & DEVICE_NAMES and all(name in config or name not in base for name in reads)
    ]


def _items(config: Config, names: list[str]) -> str:
    return ", ".join(f"{name}={config[name]}" for name in names)


def _nearest(
    space: Space, base: Config, free: list[Knob], failures: list, problem: Problem, device: DeviceLimits
) -> tuple[Config | None, bool]:
    """The feasible completion of ``base`` nearest it that moves only knobs in ``free``, and whether the
    search ran out of its budget (then the first value is None)."""
    position = {k.name: i for i, k in enumerate(space.knobs)}
    free_names = {k.name for k in free}
    searched: set[str] = set()
    involved = set().union(*(reads for _, reads in failures)) & free_names
    checks = 0
    while involved - searched:
        knobs = sorted((space.knob(n) for n in involved), key=lambda k: position[k.name])
        read: set[str] = set()
        for count in range(1, len(knobs) + 1):
            # a round tried the sets of knobs within those it searched already
            sets = [m for m in itertools.combinations(knobs, count) if not searched.issuperset(k.name for k in m)]
            if sum(math.prod(len(k.values) - 1 for k in m) for m in sets) > MAX_LEVEL:
                return None, True
            level = [
                (
                    _distance(moved, values, base),
                    [position[k.name] for k in moved],
                    _indices(moved, values),
                    values,
                    moved,
                )
                for moved in sets
                for values in itertools.product(*(_others(k, base[k.name]) for k in moved))
            ]
            level.sort(key=lambda c: c[:3])
            for *_, values, moved in level:
                if checks >= MAX_COMPLETION_CHECKS:
                    return None, True
                checks += 1
                candidate = {**base, **{k.name: v for k, v in zip(moved, values)}}
                failed = space.failures(candidate, problem, device)
                if not failed:
                    return candidate, False
                for _, reads in failed:
                    read |= reads
        searched |= involved
        involved |= read & free_names
    return None, False


def _indices(moved: tuple[Knob, ...], values: tuple[int, ...]) -> list[int]:
    return [k.values.index(v) for k, v in zip(moved, values)]


def _others(knob: Knob, default: int) -> list[int]:
    return [v for v in knob.values if v != default]


def _distance(moved: tuple[Knob, ...], values: tuple[int, ...], base: Config) -> int:
    """Steps from the defaults: along an ordered knob's values, or 1 for another value of a category knob."""
    return sum(abs(k.values.index(v) - k.values.index(base[k.name])) if k.ordered else 1 for k, v in zip(moved, values))
