"""Every feasible config of a small space once, in a seeded random order (``--sampler grid``)."""

from __future__ import annotations

import itertools
from collections.abc import Set

from ..devices import DeviceLimits
from ..problem import Problem
from ..space import Config, Space, config_key
from ._base import Search

__all__ = ["GRID_LIMIT", "ExhaustiveSearch"]

#: points of the full grid (before constraints) the exhaustive search enumerates: each gets a static check, about
#: 4,000 a second on one slow core, so the limit costs at most ~16 s before the first proposal
GRID_LIMIT = 65_536


class ExhaustiveSearch(Search):
    """Enumerates the grid once, keeps the statically feasible points (so an exhaustive sweep spends
    nothing on the infeasible ones) and proposes them in a random order fixed by the seed."""

    exhaustive = True

    def __init__(self, space: Space, problem: Problem, device: DeviceLimits, seed: int | None) -> None:
        super().__init__(space, problem, device, seed)
        names = [k.name for k in space.knobs]
        grid = (dict(zip(names, values)) for values in itertools.product(*(k.values for k in space.knobs)))
        self.order = [c for c in grid if self.feasible(c)]
        self.rng.shuffle(self.order)
        self._next = 0

    def propose(self, taken: Set[str]) -> Config | None:
        while self._next < len(self.order):
            config = self.order[self._next]
            self._next += 1
            if config_key(config) not in taken and config_key(config) not in self.results:
                return config
        return None

    def withdraw(self, config: Config) -> None:
        pass  # whoever took it measures it
