"""Synthetic landscapes of the class the default search used to fail on (issue 17), for replay.

Each is a :class:`tuner.run.SyntheticOracle` over a real space and its real static check, drawn at
random per seed, so a search is judged on many landscapes it was never tuned on:

- ``coupled``: the best differs from the default in two or three knobs, and two of them pay only
  together: either change alone is worse than the default (a pair term that punishes half the move).
- ``island``: the same, and the best lies across an *island* knob: a knob the default cannot change
  alone (every such single step is statically infeasible, e.g. consumer warpgroups with their register
  budgets), so only a coupled move reaches it.
- ``decoy``: ``coupled`` with the default on a hill of its own that is within a few percent of the best,
  and two more lesser peaks elsewhere: climbing from the default finds a local optimum.

In all of them a single step away from the best costs 1-6% on most knobs (one or two knobs are
weak: 0.2-0.6% a step), so only a handful of configs come within 1% of the best; measurements
carry 1-3% noise (half-normal, below the true value; the best is measured without noise, so the
stored best is the planted one). The best config and its TFLOPS are known by construction.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from collections.abc import Callable

from tuner.devices import DeviceLimits
from tuner.problem import Problem
from tuner.run._synthetic import Basin, Landscape, SyntheticOracle, feasible_configs
from tuner.space import Config, Space, config_key

__all__ = ["FAMILIES", "coupled", "drawn_evaluations", "family"]

PEAK_TFLOPS = 500.0
#: the fewest and most knob changes from the default at which coupled() places the best (island: one more)
CHANGES = (2, 3)


@functools.lru_cache(maxsize=16)
def _feasible(space: Space, problem: Problem, device: DeviceLimits) -> tuple[tuple[tuple[str, int], ...], ...]:
    return tuple(tuple(sorted(c.items())) for c in feasible_configs(space, problem, device))


def _island_knobs(space: Space, problem: Problem, device: DeviceLimits, default: Config) -> set[str]:
    """Knobs with more than one value none of whose single changes from ``default`` is feasible."""
    out = set()
    for k in space.knobs:
        others = [v for v in k.values if v != default[k.name]]
        if others and all(space.check({**default, k.name: v}, problem, device) is not None for v in others):
            out.add(k.name)
    return out


def _main_penalties(
    space: Space, names: list[str], centre: Config, rng: random.Random, weak: set[str]
) -> list[list[float]]:
    """Per knob, the log-TFLOPS penalty of each value index around ``centre``: 1-6% a step (0.2-0.6% for
    the ``weak`` knobs), growing with the steps of an ordered knob, each side its own curvature."""
    rows = []
    for name in names:
        knob = space.knob(name)
        c = knob.values.index(centre[name])
        w = math.exp(
            rng.uniform(math.log(0.002), math.log(0.006))
            if name in weak
            else rng.uniform(math.log(0.01), math.log(0.06))
        )
        power = {-1: rng.uniform(0.7, 1.5), 1: rng.uniform(0.7, 1.5)}
        rows.append(
            [
                0.0
                if i == c
                else w * abs(i - c) ** power[1 if i > c else -1]
                if knob.ordered
                else w * rng.uniform(0.8, 1.6)
                for i in range(len(knob.values))
            ]
        )
    return rows


def _pairs(
    space: Space, names: list[str], centre: Config, rng: random.Random, share: float
) -> list[tuple[int, int, tuple[tuple[float, ...], ...]]]:
    """Random small pair penalties (0-2%) on a share of the pairs of knobs, zero at ``centre``."""
    out = []
    for a, b in itertools.combinations(range(len(names)), 2):
        if rng.random() >= share:
            continue
        ka, kb = space.knob(names[a]), space.knob(names[b])
        ca, cb = ka.values.index(centre[names[a]]), kb.values.index(centre[names[b]])
        t = rng.uniform(0.0, 0.02)
        out.append(
            (
                a,
                b,
                tuple(
                    tuple(0.0 if (i, j) == (ca, cb) else t * rng.random() for j in range(len(kb.values)))
                    for i in range(len(ka.values))
                ),
            )
        )
    return out


def _basin(
    space: Space, names: list[str], centre: Config, height: float, rng: random.Random, weak: set[str], extra=()
) -> Basin:
    idx = tuple(space.knob(n).values.index(centre[n]) for n in names)
    main = _main_penalties(space, names, centre, rng, weak)
    pairs = _pairs(space, names, centre, rng, 0.2) + list(extra)
    return Basin(idx, height, tuple(map(tuple, main)), tuple(pairs))


def coupled(
    space: Space,
    problem: Problem,
    device: DeviceLimits,
    seed: int,
    *,
    island: bool = False,
    decoy: bool = False,
    changes: tuple[int, int] = CHANGES,
    default_ratio: tuple[float, float] = (0.92, 0.97),
    noise: tuple[float, float] = (0.01, 0.03),
) -> SyntheticOracle:
    """One landscape of the module docstring's kinds (``island``, ``decoy``; neither: ``coupled``)."""
    rng = random.Random(f"coupled:{space.name}:{problem.slug()}:{seed}:{island}:{decoy}")
    names = [k.name for k in space.knobs if len(k.values) > 1]
    default = space.defaults(problem.head_dim)
    configs = [dict(c) for c in _feasible(space, problem, device)]
    islands = _island_knobs(space, problem, device, default) if island else set()
    lo, hi = changes

    def candidate(c: Config) -> bool:
        changed = {n for n in names if c[n] != default[n]}
        return lo <= len(changed) <= hi + (1 if island else 0) and (not island or bool(changed & islands))

    pool = [c for c in configs if candidate(c)]
    if not pool:
        raise ValueError(f"no feasible config of {space.name} fits a {'island' if island else 'coupled'} landscape")
    best = rng.choice(pool)
    changed = [n for n in names if best[n] != default[n]]
    a, b = rng.sample(changed, 2)
    weak = set(rng.sample([n for n in names if n not in changed], min(2, len(names) - len(changed))))
    ratio = rng.uniform(*default_ratio)
    ia, ib = names.index(a), names.index(b)
    main = _main_penalties(space, names, best, rng, weak)
    at_default = [space.knob(n).values.index(default[n]) for n in names]
    total = sum(main[k][i] for k, i in enumerate(at_default))
    gamma = -math.log(ratio) / total  # the default is `ratio` of the best on the best's hill
    main = [[gamma * x for x in row] if names[k] in changed else row for k, row in enumerate(main)]
    # half the coupled move is a little worse than none: the pair punishes a without b and b without a by
    # what the move alone would have gained, and 0.5-2% more
    ka, kb = space.knob(a), space.knob(b)
    ba, bb = ka.values.index(best[a]), kb.values.index(best[b])
    alone_a = main[ia][at_default[ia]] + rng.uniform(0.005, 0.02)
    alone_b = main[ib][at_default[ib]] + rng.uniform(0.005, 0.02)
    table = tuple(
        tuple(
            alone_a if i == ba and j != bb else alone_b if i != ba and j == bb else 0.0 for j in range(len(kb.values))
        )
        for i in range(len(ka.values))
    )
    pair = (ia, ib, table) if ia < ib else (ib, ia, tuple(zip(*table)))
    top = Basin(
        tuple(space.knob(n).values.index(best[n]) for n in names),
        0.0,
        tuple(map(tuple, main)),
        tuple([*_pairs(space, names, best, rng, 0.2), pair]),
    )
    basins = [top]
    if decoy:
        basins.append(_basin(space, names, default, math.log(min(0.985, ratio * rng.uniform(1.01, 1.04))), rng, weak))
        far = [c for c in configs if sum(c[n] != best[n] for n in names) >= 3]
        for centre in rng.sample(far, min(2, len(far))):
            basins.append(_basin(space, names, centre, math.log(rng.uniform(0.93, 0.98)), rng, weak))
    landscape = Landscape(
        space=space,
        peak_tflops=PEAK_TFLOPS,
        basins=tuple(basins),
        noise=rng.uniform(*noise),
        salt=f"coupled{seed}",
        noiseless=frozenset({config_key(best)}),
        never_fail=frozenset({config_key(best), config_key(default)}),
        best_tflops=PEAK_TFLOPS,
        knob_names=tuple(names),
    )
    kind = "island" if island else "decoy" if decoy else "coupled"
    return SyntheticOracle(f"{kind}-{seed}", space, problem, device, {}, landscape=landscape, kind=kind)


FAMILIES: dict[str, Callable[..., SyntheticOracle]] = {
    "coupled": coupled,
    "island": functools.partial(coupled, island=True),
    "decoy": functools.partial(coupled, decoy=True),
}


def family(kind: str, space: Space, problem: Problem, device: DeviceLimits) -> Callable[[int], SyntheticOracle]:
    """seed -> that seed's landscape of ``kind`` (picklable)."""
    return functools.partial(FAMILIES[kind], space, problem, device)


def drawn_evaluations(oracle: SyntheticOracle, floor: float, changes: tuple[int, int] = CHANGES) -> float:
    """Expected evaluations until a config of noise-free TFLOPS >= ``floor`` is measured by a search that knows
    where :func:`coupled` puts the best (uniformly among the feasible configs ``changes`` knob changes from the
    default) and nothing else: the default first, then those configs in random order (the first of m such
    configs among n comes (n + 1) / (m + 1) into them on average); inf when none reaches ``floor``. Where the
    landscape shows nothing above the default short of the best's own basin (decoy), no measurement says which
    of them to try first, so no search does much better than this draw.
    """
    space, problem, device, landscape = oracle.space, oracle.problem, oracle.device, oracle.landscape
    default = space.defaults(problem.head_dim)
    lo, hi = changes
    pool = []
    for items in _feasible(space, problem, device):
        config = dict(items)
        if lo <= sum(config[n] != default[n] for n in landscape.knob_names) <= hi:
            pool.append(landscape.noiseless_tflops(config))
    reached = sum(v >= floor for v in pool)
    return 1 + (len(pool) + 1) / (reached + 1) if reached else math.inf
