"""The default search's scores by replay, design sweeps apart from held-out ones (tests/data/README.md).

    python -m tests.search.score [--windows 1 17] [--seeds 20] [--families] [--jobs 2]
    python -m tests.search.score --held-out ...     # the held-out sweeps too: only to score a finished change
    python -m tests.search.score --sealed ...       # and the sealed ones (measured, never scored): to judge it

One Markdown row per (sweep, window): evaluations to come within 1% of the stored best, median / p90 over the
seeds, the runs never within 1% in the budget, and the median over seeds of best-so-far after 25 evaluations, as
the tables of tests/data/README.md give them. Without ``--held-out`` no held-out sweep is replayed (asking for one
by ``--only`` is refused): a change to the search is designed on the design sweeps (and ``--families``: the
coupled, island and decoy landscapes of tests/search/landscapes.py, 10 seeds each), and scored on the held-out
ones once, at the end, with the scoring recorded in tests/data/README.md. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence

from tests.gpu.measure_sweeps import SEALED, SWEEPS
from tests.search.test_search_quality import STORED, _family, _hits, _oracle, _p90, _sweep_oracle
from tuner.run import replay
from tuner.search import DEFAULT_SEARCH

BUDGET = 50  # evaluations per run on a sweep (60 on a synthetic landscape, as its tests replay)
FAMILY_SEEDS = 10


def held_out(name: str) -> bool:
    return any(s.name == name and s.held_out for s in SWEEPS + SEALED)


def sweep_names(include_held_out: bool, include_sealed: bool = False) -> list[str]:
    """The design sweeps (the two sm90_small ones, then measure_sweeps' design sweeps), then the held-out ones,
    then the sealed ones (measured and never scored)."""
    names = [*STORED, *(s.name for s in SWEEPS if not s.held_out)]
    names += [s.name for s in SWEEPS if s.held_out] if include_held_out else []
    return names + ([s.name for s in SEALED] if include_sealed else [])


def _load(name: str):
    """The replay oracle of a stored or sealed sweep."""
    sealed = {s.name: s for s in SEALED}
    return _sweep_oracle(sealed[name]) if name in sealed else _oracle(name)


def _split(name: str) -> str:
    return "sealed" if any(s.name == name for s in SEALED) else "held out" if held_out(name) else "design"


def row(label: str, split: str, window: int, runs) -> str:
    hits = _hits(runs)
    never = sum(math.isinf(h) for h in hits)
    after = statistics.median(run.best_after(25) / run.best for run in runs)
    fmt = lambda h: "never" if math.isinf(h) else f"{h:g}"  # noqa: E731
    return (
        f"| {label} | {split} | {window} | {fmt(statistics.median(hits))} / {fmt(_p90(hits))} | {never} | {after:.3f} |"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, nargs="+", default=[1, 17], help="configs in flight (default 1 17)")
    parser.add_argument("--seeds", type=int, default=20, help="seeds 0..N-1 per sweep (default %(default)s)")
    parser.add_argument("--only", action="append", help="this sweep only (repeatable)")
    parser.add_argument("--families", action="store_true", help="the synthetic families too")
    parser.add_argument("--held-out", action="store_true", help="the held-out sweeps too (score a finished change)")
    parser.add_argument(
        "--sealed", action="store_true", help="the held-out and the sealed sweeps too (judge a finished change)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="processes (default %(default)s)")
    args = parser.parse_args(argv)
    args.held_out |= args.sealed
    names = sweep_names(args.held_out, args.sealed)
    if args.only:
        unknown = [n for n in args.only if n not in sweep_names(True, True)]
        if unknown:
            parser.error(f"unknown sweep {unknown[0]!r}; choose from {', '.join(sweep_names(True, True))}")
        hidden = [n for n in args.only if n not in names]
        if hidden:
            flag = "--sealed" if _split(hidden[0]) == "sealed" else "--held-out"
            parser.error(f"{hidden[0]} is {_split(hidden[0])}: pass {flag} to score it (and record the scoring)")
        names = [n for n in names if n in args.only]
    if args.held_out:
        print("scoring held-out sweeps: record this scoring in tests/data/README.md", file=sys.stderr)
    print("| sweep | split | window | to 1%: median / p90 | never | best after 25 |")
    print("|---|---|---|---|---|---|")
    for window in args.windows:
        for name in names:
            runs = replay(_load(name), [DEFAULT_SEARCH], range(args.seeds), BUDGET, window=window, jobs=args.jobs)
            print(row(name, _split(name), window, runs), flush=True)
        if args.families:
            for kind in ("coupled", "island", "decoy"):
                runs = replay(_family(kind), [DEFAULT_SEARCH], range(FAMILY_SEEDS), 60, window=window, jobs=args.jobs)
                print(row(f"{kind} landscapes", "synthetic", window, runs), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
