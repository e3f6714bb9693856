"""What every search strategy does: propose feasible configs nobody has taken, learn from results."""

from __future__ import annotations

import itertools
import random
from abc import ABC, abstractmethod
from collections.abc import Set
from dataclasses import dataclass

from ..devices import DeviceLimits
from ..problem import Problem
from ..space import Config, Space, config_key

__all__ = ["Search", "SearchStats", "nearest_feasible", "neighbours"]


@dataclass
class SearchStats:
    """Counts of one process's search, all settled in memory (none costs a storage round trip)."""

    asks: int = 0  # proposals drawn from the strategy's model
    infeasible: int = 0  # of those, rejected by the static check (and repaired to a feasible neighbour)
    repeats: int = 0  # of those, configs already evaluated or in flight


class Search(ABC):
    """Proposes configs to measure for one problem on one device.

    A proposal is statically feasible and not in ``taken`` (evaluated, or being measured by
    any tuner); what the strategy draws that is infeasible or taken is settled in memory.
    :meth:`observe` shows it every finished trial of the stored study, its own proposals
    and everyone else's, once each.
    """

    exhaustive = False  # True: the strategy knows every feasible config, so a random draw finds nothing new

    def __init__(self, space: Space, problem: Problem, device: DeviceLimits, seed: int | None) -> None:
        self.space, self.problem, self.device = space, problem, device
        self.rng = random.Random(seed)
        self.stats = SearchStats()
        self.results: dict[str, float | None] = {}  # config key -> TFLOPS (None: failed)
        self._feasible: dict[tuple[int, ...], bool] = {}
        self._names = [k.name for k in space.knobs]

    def feasible(self, config: Config) -> bool:
        """Whether ``config`` passes the static check (each config is checked once)."""
        key = tuple(config[n] for n in self._names)
        if key not in self._feasible:
            self._feasible[key] = self.space.feasible(config, self.problem, self.device)
        return self._feasible[key]

    def observe(self, config: Config, value: float | None) -> None:
        """A finished trial of ``config``: its TFLOPS, or None when it failed (wrong, crashed, ...)."""
        key = config_key(config)
        if key not in self.results:
            self.results[key] = value
            self._learn(config, value)

    def _learn(self, config: Config, value: float | None) -> None:  # noqa: B027 - optional hook
        """Strategies with a model update it here (first result of each config only)."""

    @abstractmethod
    def propose(self, taken: Set[str]) -> Config | None:
        """A feasible config whose key is not in ``taken``, or None when the strategy has none to offer."""

    def add_start(self, config: Config) -> None:  # noqa: B027 - optional hook
        """A config to restart from (a neighbouring tuned shape's winner, enqueued as a warm start); strategies
        that climb use every one given, the others ignore them."""

    def withdraw(self, config: Config) -> None:  # noqa: B027 - optional hook
        """A proposal that will not be measured by this process (another tuner took it first)."""


def _steps(space: Space, name: str, value: int) -> list[tuple[int, int]]:
    """(distance, other value) for every other value of knob ``name``: index steps for an ordered knob."""
    knob = space.knob(name)
    here = knob.values.index(value)
    return [(abs(i - here) if knob.ordered else 1, v) for i, v in enumerate(knob.values) if v != value]


def neighbours(space: Space, config: Config, rng: random.Random, *, changes: int = 1) -> list[Config]:
    """Configs that differ from ``config`` in exactly ``changes`` knobs, nearest first (an ordered
    knob's step to the next value is 1, two values away 2; any change of an unordered knob is 1),
    ties in random order."""
    names = [k.name for k in space.knobs if len(k.values) > 1]
    out: list[tuple[int, float, Config]] = []
    for subset in itertools.combinations(names, changes):
        for choice in itertools.product(*(_steps(space, n, config[n]) for n in subset)):
            other = dict(config)
            for n, (_, v) in zip(subset, choice):
                other[n] = v
            out.append((sum(d for d, _ in choice), rng.random(), other))
    out.sort(key=lambda item: item[:2])
    return [c for _, _, c in out]


def nearest_feasible(
    search: Search, config: Config, taken: Set[str], *, max_changes: int = 3, max_checks: int = 4000
) -> Config | None:
    """The feasible, untaken config closest to ``config`` (fewest knobs changed, then smallest steps),
    looking at no more than ``max_checks`` candidates; None when none is found."""
    checked = 0
    for changes in range(1, max_changes + 1):
        for other in neighbours(search.space, config, search.rng, changes=changes):
            if config_key(other) in taken:
                continue
            checked += 1
            if search.feasible(other):
                return other
            if checked >= max_checks:
                return None
    return None
