"""Where the default search's evaluations go on one planted landscape (tests/search/landscapes.py) or one stored
sweep (tests/data/README.md), one line each.

    PYTHONPATH=. python -m tests.search.trace island 8 [--budget 60]
    PYTHONPATH=. python -m tests.search.trace d128-bf16-full-b1-h32-n16384 3 --budget 50
    PYTHONPATH=. python -m tests.search.trace d64-fp16-full-b16-h12-n1536 0 --budget 50 --window 17

Each line: the evaluation's number, its TFLOPS over the best (the planted one, or the sweep's best measured), the
best so far, the knobs it changes from the default, and the (centre, level) the climb proposed it from (the centre
as its changes from the default); ``***`` marks the planted best, or on a sweep the first config within 1% of its
best, where the run ends. The run is window 1 (each result known before the next proposal) and seeded like
``replay``, without the tuning loop's random exploration (the search alone). With ``--window N`` it is ``replay``'s
own run instead (the tuning loop with N configs in flight, its exploration included), in the order the oracle was
asked, without the centres. Tracing a held-out sweep makes it seen.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from tests.search.landscapes import FAMILIES
from tests.search.test_search_quality import D64, D64_PROBLEM, H200, STORED, SWEEPS, _oracle
from tuner.run import replay_one
from tuner.search import DEFAULT_SEARCH, make_search
from tuner.search._pattern import LEVELS
from tuner.space import Config, config_key, load_space

WITHIN = 0.99  # on a sweep: the run ends at the first config within 1% of the best, as replay counts it


def _changes(config: Config, default: Config) -> str:
    return " ".join(f"{n}={v}" for n, v in config.items() if v != default[n]) or "(default)"


def _subject(kind: str, seed: int):
    """(oracle, is_best(config, value), what the best is) for a landscape family or a stored sweep's name."""
    if kind in FAMILIES:
        oracle = FAMILIES[kind](load_space(D64), D64_PROBLEM, H200, seed)
        land = oracle.landscape
        default = oracle.space.defaults(problem=oracle.problem, device=oracle.device)
        best = {
            **default,
            **{n: oracle.space.knob(n).values[i] for n, i in zip(land.knob_names, land.basins[0].centre)},
        }
        return (
            oracle,
            lambda config, value: config_key(config) == config_key(best),
            f"the best changes {_changes(best, default)}",
        )
    oracle = _oracle(kind)
    return (
        oracle,
        lambda config, value: bool(value) and value >= WITHIN * oracle.best,
        "*** marks the first config within 1% of the best",
    )


def _line(i: int, value: float | None, top: float, best: float, what: str, marked: bool) -> str:
    """Evaluation ``i``: its TFLOPS and the best so far over ``best``, what it changes, ``***`` where ``marked``."""
    ratio = f"{value / best:.3f}" if value else "failed"
    return f"{i:3d} {ratio} best {top / best:.3f}  {what}{' ***' if marked else ''}"


def trace(kind: str, seed: int, budget: int) -> list[str]:
    """The lines of the module docstring for landscape family or sweep ``kind``, seed ``seed``."""
    oracle, is_best, what = _subject(kind, seed)
    default = oracle.space.defaults(problem=oracle.problem, device=oracle.device)
    search = make_search(DEFAULT_SEARCH, oracle.space, oracle.problem, oracle.device, seed)
    lines = [f"{oracle.describe()}; {what}"]
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
        lines.append(_line(i, value, top, oracle.best, _changes(config, default) + where, is_best(config, value)))
        if is_best(config, value):
            break
    return lines


def trace_window(kind: str, seed: int, budget: int, window: int) -> list[str]:
    """:func:`trace`'s lines for ``replay``'s run with ``window`` configs in flight (no centres: the loop proposes)."""
    oracle, is_best, what = _subject(kind, seed)
    default = oracle.space.defaults(problem=oracle.problem, device=oracle.device)
    asked: list[tuple[Config, float | None]] = []
    measure = oracle.tflops

    def recorded(config: Config) -> float | None:
        asked.append((dict(config), measure(config)))
        return asked[-1][1]

    object.__setattr__(oracle, "tflops", recorded)  # the oracle is frozen; this copy is ours
    replay_one(oracle, DEFAULT_SEARCH, seed, budget, window)
    lines, top = [f"{oracle.describe()}; {what}; {window} in flight"], 0.0
    for i, (config, value) in enumerate(asked, 1):
        top = max(top, value or 0.0)
        lines.append(_line(i, value, top, oracle.best, _changes(config, default), is_best(config, value)))
        if is_best(config, value):
            break
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=sorted(FAMILIES) + sorted([*STORED, *SWEEPS]))
    parser.add_argument("seed", type=int)
    parser.add_argument("--budget", type=int, default=60)
    parser.add_argument("--window", type=int, default=1, help="configs in flight (above 1: replay's own run)")
    args = parser.parse_args(argv)
    if args.window > 1:
        print("\n".join(trace_window(args.kind, args.seed, args.budget, args.window)))
    else:
        print("\n".join(trace(args.kind, args.seed, args.budget)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
