"""Pattern search: climb from the family default through ever wider neighbourhoods, ranked by a surrogate.

The default config is measured first (the tuner enqueues it), and it is good: the best config is
usually a few knob changes away, often changes that only pay together (deeper K/V stages *and*
ping-pong). So the search walks the space from the default instead of sampling it:

- A *centre* is a measured config; its neighbourhood has *levels*, nearest first: (1) one knob one
  step (an ordered knob's next value, or up to a quarter of a long list of values away; any other
  value of an unordered one); (2) a one-step change
  that the static check refuses alone, repaired by the fewest further steps of other knobs (a move
  the constraints couple to another: a bigger producer register budget needs a smaller consumer
  one); (3) one knob set to a farther value (repaired likewise); (4) two knobs one step each.
- Proposals come from the (centre, level) of highest priority: the centre's log TFLOPS less
  :data:`LEVEL_PENALTY` per level beyond the first. A better result moves the search to its
  neighbourhood at once (first improvement); a neighbourhood is otherwise proposed to its end,
  so a change that looked bad elsewhere is still tried next to the new best. When the best
  config's nearest neighbours are spent, the next-best centres and wider levels take over; when
  every level of every measured config is spent, :meth:`propose` returns None and the tuner
  explores at random.
- Within a neighbourhood, configs are ranked by an additive surrogate of per-knob-value effects
  (:class:`~._model.AdditiveModel`, which continues the trend of an ordered knob), ties at random.

Nothing measured, in flight, or taken by another tuner is proposed again (no repeats), and with
compile-ahead the proposals made before results arrive continue down the same ranked levels.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Set

from ..devices import DeviceLimits
from ..problem import Problem
from ..space import Config, Knob, Space, config_key
from ._base import Search
from ._model import AdditiveModel

__all__ = ["LEVEL_PENALTY", "LEVELS", "PatternSearch", "constraint_knobs", "ring"]

#: the levels of a neighbourhood, nearest first (see the module docstring)
LEVELS = ("step", "coupled step", "jump", "pair")
#: priority lost per level beyond the first, in log TFLOPS: a neighbour's wider level waits for centres
#: within 0.5% of it
LEVEL_PENALTY = 0.005
REPAIR_STEPS = 2  # further steps a repair may take
REPAIR_CHECKS = 200  # static checks one repair may spend


def ring(space: Space, config: Config, distance: int, *, keep: Set[str] = frozenset()) -> Iterator[Config]:
    """Every config exactly ``distance`` steps from ``config`` (an ordered knob's step to the next value is
    1, two values away 2; any change of an unordered knob is 1), each once; the knobs in ``keep`` stay."""
    moves = []
    for k in space.knobs:
        if len(k.values) < 2 or k.name in keep:
            continue
        here = k.values.index(config[k.name])
        moves.append([(k.name, v, abs(i - here) if k.ordered else 1) for i, v in enumerate(k.values) if i != here])

    def extend(start: int, left: int, changed: dict[str, int]) -> Iterator[Config]:
        if left == 0:
            yield {**config, **changed}
            return
        for i in range(start, len(moves)):
            for name, value, steps in moves[i]:
                if steps <= left:
                    yield from extend(i + 1, left - steps, {**changed, name: value})

    yield from extend(0, distance, {})


def constraint_knobs(space: Space) -> dict[str, set[str]]:
    """Per constraint, the knobs it reads, directly or through derived values."""
    knobs = {k.name for k in space.knobs}
    reads: dict[str, set[str]] = {}
    for d in space.derived:  # declared before use: one pass in order resolves chains
        reads[d.name] = set().union(*(({n} & knobs) | reads.get(n, set()) for n in d.expr.names))
    return {c.name: set().union(*(({n} & knobs) | reads.get(n, set()) for n in c.expr.names))
            for c in space.constraints}


def _reach(knob: Knob) -> int:
    """Steps along an ordered knob that still count as one move: 1, up to a quarter of a long value list
    (a register budget of 13 values moves by up to 3 at once; measurement noise hides single steps)."""
    return max(1, (len(knob.values) - 1) // 4)


def _changes(a: Config, b: Config) -> int:
    return sum(a[n] != b[n] for n in a)


class PatternSearch(Search):
    """See the module docstring."""

    def __init__(self, space: Space, problem: Problem, device: DeviceLimits, seed: int | None, *,
                 level_penalty: float = LEVEL_PENALTY) -> None:
        super().__init__(space, problem, device, seed)
        self.start = space.defaults(problem.head_dim)
        self.level_penalty = level_penalty
        self.model = AdditiveModel(space)
        self.values: dict[str, float] = {}  # measured configs that ran: key -> log TFLOPS
        self.configs: dict[str, Config] = {config_key(self.start): self.start}  # centres, and the start
        self.current: tuple[float, str, int] | None = None  # (priority, centre key, level) proposing now
        self._heads: list[tuple[float, float, str, int]] = []  # max-heap of (-priority, tie, centre key, level)
        self._neighbourhoods: dict[tuple[str, int], list[tuple[str, Config]]] = {}
        self._open: set[str] = set()  # own proposals not yet observed
        self._reads = constraint_knobs(space)

    # -- learning ---------------------------------------------------------------------------------
    def _learn(self, config: Config, value: float | None) -> None:
        key = config_key(config)
        self._open.discard(key)
        if value is None or value <= 0:
            self.model.add_failure(config)
            return
        self.model.add(config, value)
        self.values[key] = math.log(value)
        self.configs[key] = config
        self._push(key, 1)

    def withdraw(self, config: Config) -> None:
        self._open.discard(config_key(config))

    # -- choosing where to propose from -------------------------------------------------------------
    def _priority(self, key: str, level: int) -> float:
        return self.values[key] - self.level_penalty * (level - 1)

    def _push(self, key: str, level: int) -> None:
        if level <= len(LEVELS):
            heapq.heappush(self._heads, (-self._priority(key, level), self.rng.random(), key, level))

    def _spent(self, key: str, level: int) -> None:
        """Nothing is left to propose at this level of this centre: its next level becomes a head."""
        if self.current is not None and self.current[1:] == (key, level):
            self.current = None
        if key in self.values:
            self._push(key, level + 1)

    def _choose(self) -> tuple[str, int] | None:
        """The (centre, level) to propose from: the current one, unless another has a higher priority;
        before any result is known, the start (the default, in flight)."""
        if not self.values:
            level = self.current[2] if self.current else 1
            if level > len(LEVELS):
                return None
            self.current = (math.inf, config_key(self.start), level)
            return self.current[1:]
        if self.current is not None and self.current[0] == math.inf:
            self.current = None  # the start's levels proposed before its result: now from the measured ones
        if self._heads and (self.current is None or -self._heads[0][0] > self.current[0]):
            if self.current is not None:  # resume it later
                heapq.heappush(self._heads, (-self.current[0], self.rng.random(), *self.current[1:]))
            neg, _, key, level = heapq.heappop(self._heads)
            self.current = (-neg, key, level)
        return self.current[1:] if self.current else None

    # -- neighbourhoods -------------------------------------------------------------------------------
    def neighbourhood(self, key: str, level: int) -> list[tuple[str, Config]]:
        """(key, config) of the feasible configs at ``level`` (1-based, :data:`LEVELS`) around centre ``key``."""
        if (key, level) not in self._neighbourhoods:
            centre = self.configs[key]
            name = LEVELS[level - 1]
            if name in ("step", "coupled step"):
                pool = [{**centre, k.name: v} for k in self.space.knobs for i, v in enumerate(k.values)
                        if 0 < abs(i - k.values.index(centre[k.name])) <= _reach(k) or not k.ordered
                        and v != centre[k.name]]
            elif name == "jump":
                pool = [{**centre, k.name: v} for k in self.space.knobs if k.ordered
                        for i, v in enumerate(k.values) if abs(i - k.values.index(centre[k.name])) > _reach(k)]
            else:
                pool = [c for c in ring(self.space, centre, 2) if _changes(c, centre) == 2]
            out: dict[str, Config] = {}
            for other in pool:
                feasible = self.feasible(other)
                if name == "coupled step" and feasible or name in ("step", "pair") and not feasible:
                    continue
                if not feasible:
                    other = self._repair(other, {n for n in other if other[n] != centre[n]})
                    if other is None:
                        continue
                out.setdefault(config_key(other), other)
            self._neighbourhoods[(key, level)] = list(out.items())
        return self._neighbourhoods[(key, level)]

    def _repair(self, config: Config, keep: Set[str]) -> Config | None:
        """The feasible config fewest steps away from ``config`` that changes only knobs (outside ``keep``)
        read by the constraints ``config`` violates (the model's favourite among equals), or None within
        :data:`REPAIR_STEPS` steps and :data:`REPAIR_CHECKS` checks."""
        env = self.space.environment(config, self.problem, self.device)
        involved = set().union(*(self._reads[c.name] for c in self.space.constraints if not c.expr(env)))
        fixed = {k.name for k in self.space.knobs} - (involved - set(keep))
        checks = 0
        for steps in range(1, REPAIR_STEPS + 1):
            options = []
            for other in ring(self.space, config, steps, keep=fixed):
                checks += 1
                if self.feasible(other):
                    options.append(other)
                if checks >= REPAIR_CHECKS:
                    break
            if options:
                return max(options, key=lambda c: self.model.predict(c) + 1e-9 * self.rng.random())
            if checks >= REPAIR_CHECKS:
                break
        return None

    # -- proposing -------------------------------------------------------------------------------------
    def propose(self, taken: Set[str]) -> Config | None:
        while (choice := self._choose()) is not None:
            key, level = choice
            best: tuple[float, str, Config] | None = None
            for other_key, other in self.neighbourhood(key, level):
                if other_key in taken or other_key in self.results or other_key in self._open:
                    continue
                score = self.model.predict(other) + 1e-9 * self.rng.random()
                if best is None or score > best[0]:
                    best = (score, other_key, other)
            if best is not None:
                self.stats.asks += 1
                self._open.add(best[1])
                return dict(best[2])
            if key in self.values:
                self._spent(key, level)
            else:  # the start before its result: its next level
                self.current = (math.inf, key, level + 1)
        return None
