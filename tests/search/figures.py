"""Replay figures of the default search on the landscape families of tests/search/landscapes.py, one line each.

    PYTHONPATH=. python -m tests.search.figures [KIND ...] [--seeds 10] [--window 1] [--jobs 2]

Each line: the family, then over its seeds (one landscape per seed, as the quality tests draw them) the median
and 90th percentile of the evaluations to come within 1% of the best (inf: never within the budget), how
many seeds never did, and the median best-so-far after 25 evaluations over the best: the figures the issue's
targets are stated in (median <= 20, p90 <= 30, best after 25 >= 0.99; window 17: median <= 30).
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Sequence

from tests.search.test_search_quality import _family, _hits, _p90
from tuner.run import replay
from tuner.search import DEFAULT_SEARCH


def figures(kind: str, seeds: int, window: int, budget: int, jobs: int) -> str:
    """The line of the module docstring for family ``kind``."""
    runs = replay(_family(kind), [DEFAULT_SEARCH], range(seeds), budget, window=window, jobs=jobs)
    hits = _hits(runs)
    after = statistics.median((run.best_after(25) or 0.0) / run.best for run in runs)
    return (
        f"{kind:8s} window {window:2d}: median {statistics.median(hits):g}, p90 {_p90(hits):g}, "
        f"never {sum(math.isinf(h) for h in hits)} of {seeds}, best after 25 {after:.3f}  {sorted(hits)}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kinds", nargs="*", default=["coupled", "island", "decoy"])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--window", type=int, default=1)
    parser.add_argument("--budget", type=int, default=60)
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args(argv)
    for kind in args.kinds:
        print(figures(kind, args.seeds, args.window, args.budget, args.jobs), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
