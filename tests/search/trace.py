"""Where the default search's evaluations go on one planted landscape (tests/search/landscapes.py), one line each.

    PYTHONPATH=. python -m tests.search.trace island 8 [--budget 60]

Each line: the evaluation's number, its TFLOPS over the planted best, the best so far, the knobs it changes
from the default, and the (centre, level) the climb proposed it from (the centre as its changes from the
default); ``***`` marks the planted best. The run is window 1 (each result known before the next proposal)
and seeded like ``replay``, without the tuning loop's random exploration (the search alone).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from tests.search.landscapes import FAMILIES
from tests.search.test_search_quality import D64, D64_PROBLEM, H200
from tuner.search import DEFAULT_SEARCH, make_search
from tuner.search._pattern import LEVELS
from tuner.space import Config, config_key, load_space


def _changes(config: Config, default: Config) -> str:
    return " ".join(f"{n}={v}" for n, v in config.items() if v != default[n]) or "(default)"


def trace(kind: str, seed: int, budget: int) -> list[str]:
    """The lines of the module docstring for landscape ``kind``, seed ``seed``."""
    oracle = FAMILIES[kind](load_space(D64), D64_PROBLEM, H200, seed)
    land = oracle.landscape
    default = oracle.space.defaults(problem=oracle.problem, device=oracle.device)
    best = {**default, **{n: oracle.space.knob(n).values[i] for n, i in zip(land.knob_names, land.basins[0].centre)}}
    search = make_search(DEFAULT_SEARCH, oracle.space, oracle.problem, oracle.device, seed)
    lines = [f"{oracle.describe()}; the best changes {_changes(best, default)}"]
    taken: set[str] = set()
    config, top = default, 0.0
    for i in range(1, budget + 1):
        where = ""
        if i > 1:
            proposed = search.propose(taken)
            if proposed is None:
                lines.append(f"{i:3d} the search has nothing left to propose")
                break
            config = proposed
            if search.current is not None and search.current[1] in search.configs:
                _, centre, level = search.current
                where = f"  from [{_changes(search.configs[centre], default)}] {LEVELS[level - 1]}"
        value = oracle.tflops(config)
        taken.add(config_key(config))
        search.observe(config, value)
        top = max(top, value or 0.0)
        mark = " ***" if config_key(config) == config_key(best) else ""
        ratio = f"{value / oracle.best:.3f}" if value else "failed"
        lines.append(f"{i:3d} {ratio} best {top / oracle.best:.3f}  {_changes(config, default)}{where}{mark}")
        if mark:
            break
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=sorted(FAMILIES))
    parser.add_argument("seed", type=int)
    parser.add_argument("--budget", type=int, default=60)
    args = parser.parse_args(argv)
    print("\n".join(trace(args.kind, args.seed, args.budget)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
