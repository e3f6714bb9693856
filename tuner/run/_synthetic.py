"""Synthetic oracles: made-up TFLOPS landscapes over a real space and its real static check, for replay.

A stored exhaustive sweep (``flashtune replay --study``) is one landscape; a search that is good
on it may only be good on it. These landscapes are drawn at random per seed, over any space file
and problem (the huge sm90 space included: values are computed when a config is measured, never
tabulated), so a search is judged on many landscapes of the kind a kernel's knobs make:

- :func:`planted`: the family default is good but not the best; the best lies a few knob
  changes away (``far=True``: anywhere in the space, with a lesser peak next to the default).
  log TFLOPS is the best of a few basins, each its peak less a penalty that grows with every
  knob's distance from the basin's centre (steps of an ordered knob) and with pairs of knobs
  (an interaction: a change that is bad alone can be good together with another), less
  measurement noise. The best config and its TFLOPS are known by construction.
- :func:`additive`: log TFLOPS as a sum of random per-knob-value effects, random pairwise
  interactions and noise, with the default's values favoured until the default is a given
  fraction of the best; the space's feasible configs are enumerated to find the best (small
  spaces only).

Either is an :class:`~tuner.replay.Oracle` for :func:`tuner.replay.replay`.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ..devices import DeviceLimits
from ..problem import Problem
from ..space import Config, Space, config_key
from ._replay import Oracle, ReplayError

__all__ = ["KINDS", "Basin", "Landscape", "SyntheticOracle", "additive", "feasible_configs", "landscapes", "planted"]

ENUMERATE_LIMIT = 200_000  # grid points additive() enumerates to find the best


@dataclass(frozen=True)
class Basin:
    """One peak: log TFLOPS relative to the global best at ``centre`` (value indices), less penalties."""

    centre: tuple[int, ...]
    height: float  # 0 for the global best, negative for a lesser peak
    main: tuple[tuple[float, ...], ...]  # per knob, the penalty of each value index (0 at the centre)
    pairs: tuple[tuple[int, int, tuple[tuple[float, ...], ...]], ...]  # (knob a, knob b, penalty[ia][ib])

    def log_value(self, idx: Sequence[int]) -> float:
        p = sum(self.main[k][i] for k, i in enumerate(idx))
        p += sum(m[idx[a]][idx[b]] for a, b, m in self.pairs)
        return self.height - p


@dataclass(frozen=True)
class Landscape:
    """TFLOPS of every config: ``peak_tflops * exp(best basin's log value [+ offset] - noise)``.

    Noise is a fixed draw per config (a replay measures each config once, as a stored sweep holds
    one measurement of each); ``failures`` of the configs fail (a wrong result, say), never the
    default or the best.
    """

    space: Space
    peak_tflops: float
    basins: tuple[Basin, ...] = ()
    additive: tuple[tuple[float, ...], ...] = ()  # additive(): per knob, the effect of each value index
    additive_pairs: tuple[tuple[int, int, tuple[tuple[float, ...], ...]], ...] = ()
    noise: float = 0.01  # log units: planted() subtracts |N(0, noise)|, additive() adds N(0, noise)
    failures: float = 0.0
    salt: str = ""
    never_fail: frozenset[str] = frozenset()  # config keys that never fail (the default, the best)
    noiseless: frozenset[str] = frozenset()  # config keys measured without noise (a planted best)
    best_tflops: float = 0.0
    knob_names: tuple[str, ...] = ()

    def index(self, config: Config) -> tuple[int, ...]:
        return tuple(self.space.knob(n).values.index(config[n]) for n in self.knob_names)

    def _draws(self, key: str) -> tuple[float, float]:
        rng = random.Random(f"{self.salt}:{key}")
        return rng.random(), rng.gauss(0.0, 1.0)

    def log_value(self, config: Config) -> float:
        idx = self.index(config)
        if self.basins:
            return max(b.log_value(idx) for b in self.basins)
        v = sum(self.additive[k][i] for k, i in enumerate(idx))
        return v + sum(m[idx[a]][idx[b]] for a, b, m in self.additive_pairs)

    def noiseless_tflops(self, config: Config) -> float:
        """The TFLOPS of ``config`` without the measurement's noise (and never failing)."""
        return self.peak_tflops * math.exp(self.log_value(config))

    def tflops(self, config: Config) -> float | None:
        key = config_key(config)
        if key in self.noiseless:
            return self.noiseless_tflops(config)
        fail, gauss = self._draws(key)
        if fail < self.failures and key not in self.never_fail:
            return None
        noise = -abs(gauss) * self.noise if self.basins else gauss * self.noise
        return self.peak_tflops * math.exp(self.log_value(config) + noise)


@dataclass(frozen=True)
class SyntheticOracle(Oracle):
    """An oracle whose TFLOPS come from a :class:`Landscape` (``results`` stays empty: nothing is tabulated)."""

    landscape: Landscape = field(kw_only=True)
    kind: str = field(kw_only=True, default="synthetic")

    @property
    def best(self) -> float:
        return self.landscape.best_tflops

    def tflops(self, config: Config) -> float | None:
        if self.space.check(config, self.problem, self.device) is not None:
            raise ReplayError(f"the synthetic oracle was asked for an infeasible config {config}")
        return self.landscape.tflops(config)

    def describe(self) -> str:
        default = self.tflops(self.space.defaults(self.problem.head_dim))
        return (
            f"{self.kind} landscape {self.study_name} over {self.space.name}: {self.problem.slug()}, best "
            f"{self.best:.1f} TFLOPS" + (f", default {default / self.best:.3f} of it" if default else "")
        )


# -- drawing landscapes ---------------------------------------------------------------------------
def _varied(space: Space) -> list[str]:
    return [k.name for k in space.knobs if len(k.values) > 1]


def _feasible(space: Space, problem: Problem, device: DeviceLimits, config: Config) -> bool:
    return space.check(config, problem, device) is None


def feasible_configs(space: Space, problem: Problem, device: DeviceLimits) -> Iterator[Config]:
    """Every statically feasible config of a small space (up to :data:`ENUMERATE_LIMIT` grid points)."""
    if space.size() > ENUMERATE_LIMIT:
        raise ReplayError(
            f"{space.name} has {space.size()} grid points; enumerating them is limited to "
            f"{ENUMERATE_LIMIT} (use a planted landscape)"
        )
    names = [k.name for k in space.knobs]
    for values in itertools.product(*(k.values for k in space.knobs)):
        config = dict(zip(names, values))
        if _feasible(space, problem, device, config):
            yield config


def _random_feasible(
    space: Space,
    problem: Problem,
    device: DeviceLimits,
    rng: random.Random,
    accept=lambda c: True,
    tries: int = 200_000,
) -> Config:
    """A feasible config that ``accept``s, drawn uniformly from the grid (``tries`` draws, rejecting the others),
    or where the feasible share is too small for that, reached by a random walk of feasible single-knob changes
    from the default (:func:`_walk`). The whole sm90 space at head dim 256, causal, N 8192: about 4 feasible in
    100,000 draws, so 200,000 draws find none about once in 3,000 (a ReplayError before the walk), and once in 30
    with a further knob that is rarely feasible there (1.7 in 100,000)."""
    for _ in range(tries):
        config = {k.name: rng.choice(k.values) for k in space.knobs}
        if accept(config) and _feasible(space, problem, device, config):
            return config
    return _walk(space, problem, device, rng, accept)


def _walk(
    space: Space, problem: Problem, device: DeviceLimits, rng: random.Random, accept, steps_per_knob: int = 8
) -> Config:
    """The end of a random walk from the default: ``steps_per_knob`` times the varied knobs' count of steps, each
    a random knob set to another of its values where the config stays feasible (an infeasible step is not taken);
    walked again until the end ``accept``s."""
    names = _varied(space)
    default = space.defaults(problem.head_dim)
    if not _feasible(space, problem, device, default):
        raise ReplayError(f"the default config of {space.name} is infeasible for {problem.slug()}")
    for _ in range(100):
        config = dict(default)
        for _ in range(steps_per_knob * len(names)):
            name = rng.choice(names)
            other = {**config, name: rng.choice([v for v in space.knob(name).values if v != config[name]])}
            if _feasible(space, problem, device, other):
                config = other
        if accept(config):
            return config
    raise ReplayError(f"no feasible config of {space.name} that the landscape accepts found for {problem.slug()}")


def _changed(
    space: Space, problem: Problem, device: DeviceLimits, config: Config, changes: int, rng: random.Random
) -> Config:
    """``config`` with ``changes`` knobs set to other values at random, feasible."""
    names = _varied(space)
    for _ in range(10_000):
        other = dict(config)
        for name in rng.sample(names, min(changes, len(names))):
            other[name] = rng.choice([v for v in space.knob(name).values if v != config[name]])
        if _feasible(space, problem, device, other):
            return other
    raise ReplayError(f"no feasible config {changes} knob changes from {config}")


def _penalties(
    space: Space, names: list[str], centre: tuple[int, ...], rng: random.Random, pair_share: float
) -> tuple[list[list[float]], list[tuple[int, int, list[list[float]]]]]:
    """Unscaled penalties around ``centre``: per knob (a weight drawn log-normally, growing with the
    steps of an ordered knob, each side its own slope and curvature) and per interacting pair."""
    main = []
    weights = [math.exp(rng.gauss(0.0, 1.0)) for _ in names]
    for k, name in enumerate(names):
        knob, c, w = space.knob(name), centre[k], weights[k]
        power = {-1: rng.uniform(0.6, 1.4), 1: rng.uniform(0.6, 1.4)}
        slope = {-1: math.exp(rng.uniform(-0.7, 0.7)), 1: math.exp(rng.uniform(-0.7, 0.7))}
        row = []
        for i in range(len(knob.values)):
            if i == c:
                row.append(0.0)
            elif knob.ordered:
                side = 1 if i > c else -1
                row.append(w * slope[side] * abs(i - c) ** power[side])
            else:
                row.append(w * rng.uniform(0.3, 1.5))
        main.append(row)
    pairs = []
    mean_w = sum(weights) / len(weights)
    for a, b in itertools.combinations(range(len(names)), 2):
        if rng.random() >= pair_share:
            continue
        t = mean_w * math.exp(rng.gauss(0.0, 1.0))
        na, nb = len(space.knob(names[a]).values), len(space.knob(names[b]).values)
        m = [[0.0 if (i, j) == (centre[a], centre[b]) else t * rng.random() ** 2 for j in range(nb)] for i in range(na)]
        pairs.append((a, b, m))
    return main, pairs


def _basin(
    space: Space,
    names: list[str],
    centre: Config,
    height: float,
    rng: random.Random,
    pair_share: float,
    median: float,
    fine: tuple[Config, float] | None = None,
) -> Basin:
    """A basin at ``centre``, its penalties scaled so that a random config of the grid has a median share
    ``median`` of the peak; ``fine = (config, ratio)``: the knobs where ``config`` differs from the centre
    (their penalties and their pairs' penalties) are scaled again so that ``config`` is ``ratio`` of the peak."""
    idx = tuple(space.knob(n).values.index(centre[n]) for n in names)
    main, pairs = _penalties(space, names, idx, rng, pair_share)

    def penalty(at: Sequence[int], main=main, pairs=pairs) -> float:
        return sum(main[k][i] for k, i in enumerate(at)) + sum(m[at[a]][at[b]] for a, b, m in pairs)

    grid = [[rng.randrange(len(space.knob(n).values)) for n in names] for _ in range(256)]
    raw = sorted(penalty(g) for g in grid)[len(grid) // 2]
    scale = -math.log(median) / raw if raw > 0 else 1.0
    main = [[scale * x for x in row] for row in main]
    pairs = [(a, b, [[scale * x for x in r] for r in m]) for a, b, m in pairs]
    if fine is not None:
        config, ratio = fine
        at = [space.knob(n).values.index(config[n]) for n in names]
        changed = {k for k, i in enumerate(at) if i != idx[k]}
        p = penalty(at, main, pairs)
        gamma = -math.log(ratio) / p if p > 0 else 1.0
        main = [[gamma * x for x in row] if k in changed else row for k, row in enumerate(main)]
        pairs = [(a, b, [[gamma * x for x in r] for r in m]) if {a, b} & changed else (a, b, m) for a, b, m in pairs]
    return Basin(idx, height, tuple(map(tuple, main)), tuple((a, b, tuple(map(tuple, m))) for a, b, m in pairs))


def planted(
    space: Space,
    problem: Problem,
    device: DeviceLimits,
    seed: int,
    *,
    changes: tuple[int, int] = (2, 4),
    default_ratio: tuple[float, float] = (0.93, 0.975),
    median: tuple[float, float] = (0.75, 0.9),
    far: bool = False,
    other_basins: tuple[int, int] = (1, 3),
    noise: float = 0.01,
    failures: float = 0.0,
    pair_share: float = 0.3,
    peak_tflops: float = 600.0,
) -> SyntheticOracle:
    """A landscape whose best config is known: see the module docstring. ``changes``: how many knobs the
    best differs from the default in (inclusive range); ``default_ratio``: the default's share of the best
    (range, before noise); ``median``: the median share of a random config (range); ``far``: the best
    anywhere (at least half the knobs changed), the default on a lesser peak of its own."""
    rng = random.Random(f"planted:{space.name}:{problem.slug()}:{seed}:{far}")
    names = _varied(space)
    default = space.defaults(problem.head_dim)
    if not _feasible(space, problem, device, default):
        raise ReplayError(f"the default config of {space.name} is infeasible for {problem.slug()}")
    ratio = rng.uniform(*default_ratio)
    width = rng.uniform(*median)
    best, basins = _planted_peak(space, problem, device, rng, names, default, ratio, width, far, changes, pair_share)
    basins += _lesser_basins(space, problem, device, rng, names, best, width, other_basins, pair_share)
    landscape = Landscape(
        space=space,
        peak_tflops=peak_tflops,
        basins=tuple(basins),
        noise=noise,
        failures=failures,
        salt=f"{seed}",
        noiseless=frozenset({config_key(best)}),
        never_fail=frozenset({config_key(best), config_key(default)}),
        best_tflops=peak_tflops,
        knob_names=tuple(names),
    )
    kind = "planted far" if far else "planted"
    return SyntheticOracle(f"{kind}-{seed}", space, problem, device, {}, landscape=landscape, kind=kind)


def _planted_peak(
    space: Space,
    problem: Problem,
    device: DeviceLimits,
    rng: random.Random,
    names: list[str],
    default: Config,
    ratio: float,
    width: float,
    far: bool,
    changes: tuple[int, int],
    pair_share: float,
) -> tuple[Config, list[Basin]]:
    """Draw the best config and the basin(s) that put it and the default where ``planted`` says: (best, basins)."""
    if far:
        best = _random_feasible(
            space,
            problem,
            device,
            rng,
            accept=lambda c: sum(c[n] != default[n] for n in names) >= (len(names) + 1) // 2,
        )
        local = _changed(space, problem, device, default, rng.randint(1, 2), rng)
        height = math.log(rng.uniform(0.95, 0.985))
        basins = [
            _basin(space, names, best, 0.0, rng, pair_share, width),
            _basin(space, names, local, height, rng, pair_share, width, (default, ratio / math.exp(height))),
        ]
    else:
        best = _changed(space, problem, device, default, rng.randint(*changes), rng)
        basins = [_basin(space, names, best, 0.0, rng, pair_share, width, (default, ratio))]
    return best, basins


def _lesser_basins(
    space: Space,
    problem: Problem,
    device: DeviceLimits,
    rng: random.Random,
    names: list[str],
    best: Config,
    width: float,
    other_basins: tuple[int, int],
    pair_share: float,
) -> list[Basin]:
    """Draw the landscape's other basins, at random feasible centres other than the best, below its peak."""
    basins = []
    for _ in range(rng.randint(*other_basins)):
        centre = _random_feasible(space, problem, device, rng)
        if config_key(centre) != config_key(best):
            basins.append(_basin(space, names, centre, math.log(rng.uniform(0.9, 0.99)), rng, pair_share, width))
    return basins


def additive(
    space: Space,
    problem: Problem,
    device: DeviceLimits,
    seed: int,
    *,
    default_ratio: tuple[float, float] = (0.93, 0.975),
    spread: tuple[float, float] = (0.06, 0.14),
    noise: float = 0.012,
    failures: float = 0.0,
    pair_share: float = 0.5,
    peak_tflops: float = 600.0,
) -> SyntheticOracle:
    """A random additive landscape with pairwise interactions over a small space (see the module docstring):
    ``spread`` is the standard deviation of log TFLOPS over the feasible configs (a range)."""
    rng = random.Random(f"additive:{space.name}:{problem.slug()}:{seed}")
    names = _varied(space)
    default = space.defaults(problem.head_dim)
    configs = list(feasible_configs(space, problem, device))
    if not any(config_key(c) == config_key(default) for c in configs):
        raise ReplayError(f"the default config of {space.name} is infeasible for {problem.slug()}")
    main, pairs = _additive_effects(space, names, rng, pair_share)
    idx = np.array([[space.knob(n).values.index(c[n]) for n in names] for c in configs])
    base = sum(np.asarray(main[k])[idx[:, k]] for k in range(len(names)))
    base = base + sum((np.asarray(m)[idx[:, a], idx[:, b]] for a, b, m in pairs), np.zeros(len(configs)))
    scale = rng.uniform(*spread) / max(float(base.std()), 1e-12)
    didx = [space.knob(n).values.index(default[n]) for n in names]
    matches = (idx == np.array(didx)).sum(axis=1)
    gauss = np.array(
        [Landscape(space=space, peak_tflops=1.0, salt=f"{seed}")._draws(config_key(c))[1] for c in configs]
    )
    target = rng.uniform(*default_ratio)
    is_default = np.array([config_key(c) == config_key(default) for c in configs])

    def default_share(bonus: float) -> float:  # the default's share of the best with its values favoured by bonus
        v = scale * base + bonus * matches + noise * gauss
        return math.exp(float(v[is_default][0] - v.max()))

    bonus = _bonus_for_share(default_share, target)
    table = tuple(
        tuple(scale * x + (bonus if i == didx[k] else 0.0) for i, x in enumerate(main[k])) for k in range(len(names))
    )
    pair_table = tuple((a, b, tuple(tuple(scale * x for x in row) for row in m)) for a, b, m in pairs)
    values = scale * base + bonus * matches + noise * gauss
    top = float(values.max())
    landscape = Landscape(
        space=space,
        peak_tflops=peak_tflops * math.exp(-top),
        additive=table,
        additive_pairs=pair_table,
        noise=noise,
        failures=failures,
        salt=f"{seed}",
        best_tflops=peak_tflops,
        knob_names=tuple(names),
        never_fail=frozenset({config_key(configs[int(values.argmax())]), config_key(default)}),
    )
    return SyntheticOracle(f"additive-{seed}", space, problem, device, {}, landscape=landscape, kind="additive")


def _additive_effects(
    space: Space, names: list[str], rng: random.Random, pair_share: float
) -> tuple[list[list[float]], list[tuple[int, int, list[list[float]]]]]:
    """An additive landscape's log-TFLOPS effects: per knob of ``names``, one per value (an ordered knob's as
    a random walk, so that neighbouring values have similar effects), and for a ``pair_share`` of the knob
    pairs (a, b) an interaction per pair of values."""
    weights = [math.exp(rng.gauss(0.0, 1.0)) for _ in names]
    main = []
    for k, name in enumerate(names):
        knob = space.knob(name)
        if knob.ordered:
            walk = [0.0]
            for _ in knob.values[1:]:
                walk.append(walk[-1] + rng.gauss(0.0, weights[k]))
            main.append(walk)
        else:
            main.append([rng.gauss(0.0, weights[k]) for _ in knob.values])
    pairs = []
    for a, b in itertools.combinations(range(len(names)), 2):
        if rng.random() < pair_share:
            t = sum(weights) / len(weights) * math.exp(rng.gauss(-0.5, 0.7))
            pairs.append(
                (a, b, [[rng.gauss(0.0, t) for _ in space.knob(names[b]).values] for _ in space.knob(names[a]).values])
            )
    return main, pairs


def _bonus_for_share(default_share: Callable[[float], float], target: float) -> float:
    """The bonus to the default's values (bisected) that gives the default ``target`` share of the best; 0 when
    it has that share already."""
    if default_share(0.0) >= target:
        return 0.0
    lo, hi = 0.0, 1.0
    while default_share(hi) < target:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if default_share(mid) < target else (lo, mid)
    return lo


# -- replaying many landscapes ------------------------------------------------------------------------
KINDS = {"planted": planted, "far": partial(planted, far=True), "additive": additive}


def landscapes(kind: str, space: Space, problem: Problem, device: DeviceLimits) -> Callable[[int], SyntheticOracle]:
    """seed -> that seed's landscape of ``kind`` (picklable, for :func:`tuner.replay.replay`)."""
    if kind not in KINDS:
        raise ReplayError(f"unknown landscape kind {kind!r}; choose one of {', '.join(KINDS)}")
    return partial(KINDS[kind], space, problem, device)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tuner.run._synthetic``: replay samplers on one synthetic landscape per seed, as ``flashtune replay``
    does on a stored study."""
    import argparse

    from ..devices import limits_for_arch
    from ..space import load_space
    from ._replay import format_markdown, format_table, replay, summarize

    p = argparse.ArgumentParser(prog="python -m tuner.synthetic", description=main.__doc__)
    p.add_argument("--space", default="sm90", help="family name or space file (default %(default)s)")
    p.add_argument("--kind", default="planted", choices=sorted(KINDS))
    p.add_argument("--arch", type=int, default=90, help="device whose nominal limits the static check uses")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--seqlen", type=int, default=4096)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--full", action="store_true", help="not causal")
    p.add_argument("--samplers", default="pattern,tpe,random,grid")
    p.add_argument("--seeds", type=int, default=20, help="landscapes (one run per sampler on each)")
    p.add_argument("--budget", type=int, default=100)
    p.add_argument("--window", type=int, default=1)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--markdown", action="store_true", help="Markdown table rows instead of the text table")
    args = p.parse_args(argv)
    space = load_space(args.space)
    problem = Problem(
        batch=args.batch,
        seqlen_q=args.seqlen,
        heads_q=args.heads,
        head_dim=args.head_dim,
        dtype=args.dtype,
        causal=not args.full,
    )
    device = limits_for_arch(args.arch)
    samplers = [s.strip() for s in args.samplers.split(",") if s.strip()]
    runs = replay(
        landscapes(args.kind, space, problem, device),
        samplers,
        range(args.seeds),
        args.budget,
        window=args.window,
        jobs=args.jobs,
    )
    rows = summarize(None, runs)
    title = f"{args.kind} landscapes over {space.name}: {problem.slug()}, {args.seeds} seeds, window {args.window}"
    print(
        format_markdown(rows, label=f"{args.kind} {space.name} {problem.slug()} w{args.window}")
        if args.markdown
        else format_table(None, rows, args.budget, title=title),
        end="",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
