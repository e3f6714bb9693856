"""Kernel Tuner's search strategies beside flashtune's default search (``pattern``), by replay on the stored sweeps.

Issue 17's target: "By replay, the default search beats Kernel Tuner's best strategy on each sweep." For each of
the seven exhaustive H200 sweeps of tests/data/ (README.md there) this script writes a Kernel Tuner cache file
(its JSON cache format: one entry per feasible config, its ``time`` the sweep's latency, ``flops / TFLOPS``,
lower is better), replays Kernel Tuner's strategies on it in simulation mode (``tune_kernel(...,
simulation_mode=True, cache=FILE)``, as ``kernel_tuner.tune_cache`` does) and flashtune's ``pattern`` on the
same oracle (``tuner.run.replay``, window 1), for the same seeds and budget, and prints one table per sweep::

    PYTHONPATH=/tmp/ktsite /work/main/.venv/bin/python -m tests.search.kernel_tuner_compare \\
        [--seeds 20] [--budget 50] [--strategies bayes_opt ...] [--sweeps d64-bf16-full-n2048 ...] [-o out.json]

Kernel Tuner is no dependency of flashtune: install it apart, into a directory put on PYTHONPATH at run time
(:data:`INSTALL`); without it the script says so and exits 2.

The search space. Kernel Tuner's ``tune_params`` are the space's knobs with their value lists, in the space
file's order (a knob held at one value is a one-value parameter); its restriction is the sweep itself: a
function that admits exactly the configs the sweep holds, so a config outside it is statically infeasible,
as for flashtune's replay, and Kernel Tuner never sends it to the runner, nor counts it.

Seeding. Kernel Tuner 1.5's strategies take no seed (``tune_kernel``'s ``seed`` reaches only its pymoo
strategies); they draw from two global generators: NumPy's (``searchspace.get_random_sample``, pso's
particles, genetic_algorithm's and diff_evo's crossovers, SciPy's ``basinhopping`` and ``dual_annealing``,
which are given no ``seed``, and scikit-learn's GP in bayes_opt) and Python's ``random`` (genetic_algorithm,
greedy_ils and the mls family's neighbour order, simulated_annealing, pso, diff_evo). And two use SciPy's
``LatinHypercube`` with no seed, which draws fresh OS entropy: bayes_opt's initial sample and
``Searchspace.get_LHS_sample`` (diff_evo's population). The script runs each strategy through a wrapper
(``_Seeded``) that, after ``tune_kernel``'s set-up and before the strategy's first draw, calls
``random.seed(seed)`` and ``numpy.random.seed(seed)`` and makes ``LatinHypercube`` take its seed from NumPy's
seeded generator. The search space's order does not depend on the process (checked). So a (strategy, seed)
run evaluates the same configs in the same order in any process, after any other runs (checked with
PYTHONHASHSEED 1 and 2 and the strategies in opposite orders) -- except bayes_opt's default method,
``multi-ultrafast``: it refits its GP only when the last prediction took less than 5 times the wall-clock
time of the evaluations since, so where evaluations are cache look-ups its refits follow the machine's
timing, and a seed's run can differ between two replays. ``bayes_opt:multi-fast`` refits before every
proposal, as ``multi-ultrafast`` does when evaluations take longer than predictions (a GPU's compile and
benchmark), and is deterministic.

Starts. Kernel Tuner's strategies start from a random config; ``pattern`` starts from the space's default.
``NAME+x0`` starts a strategy that takes a start (:data:`X0_STRATEGIES`) from the same default
(strategy option ``x0``), to show how much of the difference the start is.

Counting. A budget of ``max_fevals`` = ``--budget``: Kernel Tuner's simulation runner counts a config the
first time it is served from the cache, and stops the strategy when the count reaches it. The evaluations
of a run are the unique configs of ``tune_kernel``'s results list, in the order it lists them (a repeat,
which Kernel Tuner serves again at no cost, is not counted again; an InvalidConfig result, which it never
sends to the runner, is not counted). The figures (:func:`figures`) are flashtune's replay figures: per
run, the evaluations until one came within 1%, 2% and 5% of the sweep's best TFLOPS (inf when none did),
their median and 90th percentile over seeds (the ceil(0.9 n)-th smallest), the runs that never did, and
the median over seeds of the best-so-far after 25 evaluations as a fraction of the best. ``pattern``'s
runs are scored by the same function from ``tuner.run.replay``'s evaluated TFLOPS.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import multiprocessing as mp
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from tests.gpu.measure_sweeps import SWEEPS as MEASURED_SWEEPS
from tuner.run import load_oracle, replay
from tuner.space import config_key
from tuner.study import open_storage

if TYPE_CHECKING:
    from tuner.run._replay import Oracle

DATA = Path(__file__).resolve().parents[1] / "data"

INSTALL = (
    "kernel_tuner is not importable: install it apart from flashtune, e.g. "
    "`/work/main/.venv/bin/pip install --target /tmp/ktsite kernel_tuner scikit-learn`, "
    "and run with PYTHONPATH=/tmp/ktsite"
)

#: the sixteen exhaustive H200 sweeps of tests/data/README.md: name -> (database, study, space file under tests/data);
#: the two of sm90_small.toml, then those tests/gpu/measure_sweeps.py measures
SWEEPS = {
    "small-fp16-causal-n4096": ("h200_sm90_small_grid.db", "grid-small", "sm90_small.toml"),
    "small-bf16-full-n2048": ("h200_sm90_small_bf16_full_n2048.db", "grid-bf16-full-n2048", "sm90_small.toml"),
} | {s.name: (s.db, s.study, f"sweep_spaces/{s.space}.toml") for s in MEASURED_SWEEPS}

#: Kernel Tuner's single-objective strategies compared by default (brute_force and the pymoo and pyATF ones left out)
STRATEGIES = (
    "bayes_opt",
    "bayes_opt:multi-fast",
    "greedy_ils",
    "greedy_mls",
    "mls",
    "ordered_greedy_mls",
    "genetic_algorithm",
    "dual_annealing",
    "simulated_annealing",
    "pso",
    "basinhopping",
    "diff_evo",
    "firefly_algorithm",
    "minimize",
    "random_sample",
)

#: those that take a start (x0): ``NAME+x0`` starts them from flashtune's default, as ``pattern`` starts
X0_STRATEGIES = tuple(s for s in STRATEGIES if s.partition(":")[0] not in ("bayes_opt", "random_sample"))

#: repeats in a row after which a Kernel Tuner run is taken as stalled and stopped (:func:`_stop_when_stalled`)
STALL = 5000

THRESHOLDS = (0.01, 0.02, 0.05)
CHECKPOINT = 25  # best-so-far after this many evaluations
KERNEL_NAME = "flashtune_fwd"


# -- the sweep as a Kernel Tuner cache ---------------------------------------------------------------------
def load_sweep(name: str) -> Oracle:
    """One stored sweep as flashtune's replay oracle."""
    file, study, space = SWEEPS[name]
    storage = open_storage(f"sqlite:///{DATA / file}", create=False)
    return load_oracle(storage, study, DATA / space)


def tune_params(oracle: Oracle) -> dict[str, list[int]]:
    """Kernel Tuner's tunable parameters: every knob with its values, in the space file's order."""
    return {k.name: list(k.values) for k in oracle.space.knobs}


def cache_key(params: dict[str, list[int]], config: dict[str, int]) -> str:
    """Kernel Tuner's cache key of a config: its parameter values joined by commas, in parameter order."""
    return ",".join(str(config[name]) for name in params)


def feasible(oracle: Oracle) -> list[tuple[dict[str, int], float | None]]:
    """Every config of the sweep with its TFLOPS (None: it failed there), in grid order."""
    params = tune_params(oracle)
    out = []
    for values in itertools.product(*params.values()):
        config = dict(zip(params, values))
        key = config_key(config)
        if key in oracle.results:
            out.append((config, oracle.results[key]))
    if len(out) != len(oracle.results):
        raise ValueError(f"{oracle.study_name}: {len(oracle.results) - len(out)} stored configs are off the grid")
    return out


def cache_entry(oracle: Oracle, config: dict[str, int], tflops: float | None) -> dict[str, Any]:
    """One cache entry: the config, its time in ms (flops / TFLOPS, as the replay oracle's latency), or a
    RuntimeFailedConfig where the sweep's run of it failed (Kernel Tuner counts that as an evaluation too)."""
    if tflops is None:
        time_ms: float | str = "RuntimeFailedConfig"
    else:
        time_ms = oracle.problem.flops / (tflops * 1e9)
    timings = {"compile_time": 0.0, "verification_time": 0.0, "benchmark_time": 0.0}
    entry = {**config, "time": time_ms, "times": [time_ms], **timings, "strategy_time": 0.0, "framework_time": 0.0}
    return {**entry, "tflops": tflops}  # the sweep's own figure, for scoring the run (Kernel Tuner ignores it)


def cache_document(oracle: Oracle) -> dict[str, Any]:
    """The sweep as a Kernel Tuner cache file (what ``tune_kernel(..., cache=FILE)`` reads back)."""
    params = tune_params(oracle)
    p = oracle.problem
    default = oracle.space.defaults(problem=p, device=oracle.device)
    return {
        "schema_version": "1.0.0",
        "device_name": oracle.device.name or "NVIDIA H200",
        "kernel_name": KERNEL_NAME,
        "problem_size": [p.batch, p.heads_q, p.seqlen_q],
        "tune_params_keys": list(params),
        "tune_params": params,
        "objective": "time",
        # not Kernel Tuner's: the config flashtune's searches start from, for the ``+x0`` strategies' x0
        "flashtune_default": [default[name] for name in params],
        "cache": {cache_key(params, c): cache_entry(oracle, c, t) for c, t in feasible(oracle)},
    }


def write_cache(oracle: Oracle, path: Path) -> Path:
    path.write_text(json.dumps(cache_document(oracle), indent=0))
    return path


# -- the figures --------------------------------------------------------------------------------------------
def evaluations_to(values: Sequence[float | None], target: float) -> float:
    """Evaluations until one reached ``target`` TFLOPS (inf: never)."""
    for i, v in enumerate(values, 1):
        if v is not None and v >= target:
            return float(i)
    return math.inf


def _p90(xs: list[float]) -> float:
    ordered = sorted(xs)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def figures(runs: Sequence[Sequence[float | None]], best: float) -> dict[str, Any]:
    """The replay figures of some runs (each: the TFLOPS of its evaluations in order) against ``best``."""
    row: dict[str, Any] = {"runs": len(runs), "evaluations": statistics.median(len(r) for r in runs)}
    for threshold in THRESHOLDS:
        hits = [evaluations_to(r, best * (1 - threshold)) for r in runs]
        row[f"to_{threshold:.0%}"] = {
            "median": statistics.median(hits),
            "p90": _p90(hits),
            "never": sum(math.isinf(h) for h in hits),
            "per_seed": hits,
        }
    seen = [[v for v in r[:CHECKPOINT] if v is not None] for r in runs]
    row[f"best_at_{CHECKPOINT}"] = statistics.median(max(s, default=0.0) / best for s in seen)
    return row


# -- the runs -------------------------------------------------------------------------------------------
def import_kernel_tuner():
    """Kernel Tuner's module, or the install line and exit 2."""
    try:
        import kernel_tuner
    except ImportError:
        print(INSTALL, file=sys.stderr)
        raise SystemExit(2) from None
    return kernel_tuner


def kt_values(results: list[dict[str, Any]], params: dict[str, list[int]], tflops: dict[str, float | None]):
    """The TFLOPS of a Kernel Tuner run's unique evaluated configs, in the order of its results list."""
    from kernel_tuner.util import InvalidConfig

    seen: set[str] = set()
    values = []
    for result in results:
        if isinstance(result.get("__error__"), InvalidConfig):
            continue  # never sent to the runner: not an evaluation
        key = cache_key(params, result)
        if key not in seen:
            seen.add(key)
            values.append(tflops[key])
    return values


class _Seeded:
    """A Kernel Tuner strategy that seeds Python's and NumPy's global generators when it starts: after
    ``tune_kernel``'s set-up (building the search space), so only the strategy's own draws follow the seed."""

    def __init__(self, strategy, seed: int):
        self.strategy, self.seed, self.stalled = strategy, seed, False

    def tune(self, searchspace, runner, tuning_options):
        import numpy as np

        tune = self.strategy.tune  # imports the strategy's module, so that its LatinHypercube can be seeded
        _seed_latin_hypercube()
        _stop_when_stalled(runner)
        random.seed(self.seed)
        np.random.seed(self.seed)
        try:
            return tune(searchspace, runner, tuning_options)
        finally:
            self.stalled = runner.stalled


def _stop_when_stalled(runner) -> None:
    """Stop a run, as its budget does (StopCriterionReached, which every strategy catches), once it has asked for
    :data:`STALL` configs in a row that it had evaluated before. A repeat costs Kernel Tuner nothing and does not
    count, so a strategy that only revisits never ends: greedy_ils did so on a d128 sweep (millions of repeats,
    5 GB, for minutes). ``runner.stalled`` says whether the guard stopped the run."""
    from kernel_tuner.util import StopCriterionReached

    run = runner.run
    runner.stalled, repeats = False, 0

    def guarded(configs, tuning_options):
        nonlocal repeats
        for config in configs:
            repeats = repeats + 1 if ",".join(map(str, config)) in runner.visited_results else 0
        if repeats >= STALL:
            runner.stalled = True
            raise StopCriterionReached(f"{STALL} evaluated configs asked for again in a row")
        return run(configs, tuning_options)

    runner.run = guarded


def _seed_latin_hypercube() -> None:
    """Make SciPy's LatinHypercube, which Kernel Tuner makes with no seed (so from fresh OS entropy: the LHS
    samples of bayes_opt and of ``searchspace.get_LHS_sample``), draw its seed from NumPy's global generator."""
    import numpy as np
    from scipy.stats import qmc

    original = getattr(qmc.LatinHypercube, "kt_compare_original", qmc.LatinHypercube)

    def latin_hypercube(d, **options):
        if options.get("rng") is None and options.get("seed") is None:
            options["rng"] = np.random.default_rng(np.random.randint(2**31))
        return original(d, **options)

    latin_hypercube.kt_compare_original = original
    qmc.LatinHypercube = latin_hypercube  # searchspace.get_LHS_sample imports it from here at each call
    bayes_opt = sys.modules.get("kernel_tuner.strategies.bayes_opt")
    if bayes_opt is not None:
        bayes_opt.LatinHypercube = latin_hypercube


def strategy_spec(spec: str) -> tuple[str, dict[str, Any], bool]:
    """``NAME[:METHOD][+x0]``: a Kernel Tuner strategy, its strategy_options (``method``: e.g. bayes_opt's
    acquisition method, basinhopping's local optimizer), and whether it starts from flashtune's default
    config (strategy option ``x0``; Kernel Tuner's own start is a random config)."""
    spec, plus, x0 = spec.partition("+")
    if plus and x0 != "x0":
        raise ValueError(f"strategy {spec + plus + x0!r}: only +x0 may follow the name")
    name, _, method = spec.partition(":")
    return name, {"method": method} if method else {}, bool(plus)


def kt_run(cache: str, spec: str, seed: int, budget: int) -> tuple[list[float | None], bool]:
    """One seeded Kernel Tuner run in simulation mode on ``cache``: its evaluations' TFLOPS in order, and whether
    it stalled (:func:`_stop_when_stalled`). ``spec``: a strategy (:func:`strategy_spec`)."""
    from constraint import FunctionConstraint

    kernel_tuner = import_kernel_tuner()
    strategy, options, from_default = strategy_spec(spec)
    document = json.loads(Path(cache).read_text())
    if from_default:
        options["x0"] = document["flashtune_default"]
    params = document["tune_params"]
    entries = document["cache"]
    tflops = {k: e["tflops"] for k, e in entries.items()}

    def in_sweep(*values) -> bool:  # the restriction: exactly the sweep's configs
        return ",".join(map(str, values)) in entries

    seeded = _Seeded(kernel_tuner.interface.strategy_map[strategy], seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results, _ = kernel_tuner.tune_kernel(
            KERNEL_NAME,
            "",
            tuple(document["problem_size"]),
            [],
            params,
            restrictions=[FunctionConstraint(in_sweep)],
            cache=cache,
            simulation_mode=True,
            strategy=seeded,
            strategy_options={"max_fevals": budget, **options},
            quiet=True,
            seed=seed,
        )
    return kt_values(results, params, tflops), seeded.stalled


def _kt_task(arguments: tuple) -> tuple[str, list[list[float | None]], list[float], int]:
    """One strategy's runs, one per seed, in one process (each run seeds the generators afresh)."""
    cache, spec, seeds, budget = arguments
    runs, seconds, stalled = [], [], 0
    for seed in seeds:
        start = time.perf_counter()
        values, stall = kt_run(cache, spec, seed, budget)
        runs.append(values)
        seconds.append(time.perf_counter() - start)
        stalled += stall
    return spec, runs, seconds, stalled


def kt_runs(cache: Path, specs: Sequence[str], seeds: dict[str, Sequence[int]], budget: int, jobs: int, log):
    """Every strategy's runs on ``cache``, a strategy per task in ``jobs`` processes: spec -> (runs, seconds,
    stalled runs)."""
    tasks = [(str(cache), spec, list(seeds[spec]), budget) for spec in specs]
    out = {}
    with mp.get_context("spawn").Pool(max(1, min(jobs, len(tasks)))) as pool:
        for spec, runs, seconds, stalled in pool.imap_unordered(_kt_task, tasks):
            out[spec] = (runs, seconds, stalled)
            log(
                f"  {spec}: {len(runs)} runs, {sum(seconds):.0f} s, {stalled} stalled, evaluations {[len(r) for r in runs]}"
            )
    return {spec: out[spec] for spec in specs}


def compare_sweep(name: str, args, log) -> dict[str, Any]:
    """``pattern`` and each Kernel Tuner strategy on one sweep: their figures and timings."""
    oracle = load_sweep(name)
    cache = write_cache(oracle, Path(args.cache_dir) / f"{name}.json")
    seeds = {s: range(args.seed_counts.get(s, args.seeds)) for s in args.strategies}
    start = time.perf_counter()
    ours = replay(oracle, ["pattern"], range(args.seeds), args.budget, window=1)
    seconds = time.perf_counter() - start
    rows = {"pattern": {**figures([r.values for r in ours], oracle.best), "seconds": seconds, "stalled": 0}}
    for spec, (runs, seconds, stalled) in kt_runs(cache, args.strategies, seeds, args.budget, args.jobs, log).items():
        rows[f"kt:{spec}"] = {**figures(runs, oracle.best), "seconds": sum(seconds), "stalled": stalled}
    return {
        "sweep": name,
        "study": oracle.study_name,
        "best": oracle.best,
        "feasible": len(oracle.results),
        "rows": rows,
    }


def best_kt(rows: dict[str, dict[str, Any]]) -> str:
    """Kernel Tuner's best strategy on a sweep: the lowest median evaluations to 1%, then the lowest p90."""
    kt = [name for name in rows if name.startswith("kt:")]
    return min(kt, key=lambda n: (rows[n]["to_1%"]["median"], rows[n]["to_1%"]["p90"], rows[n]["to_1%"]["never"]))


def verdict(result: dict[str, Any]) -> str:
    """Whether ``pattern`` beats Kernel Tuner's best: a lower median evaluations to 1% than every Kernel Tuner
    strategy's median, and a lower p90 than every one's p90 (the lowest of each may be two strategies)."""
    rows = result["rows"]
    kt = [name for name in rows if name.startswith("kt:")]
    by_median = best_kt(rows)
    by_p90 = min(kt, key=lambda n: (rows[n]["to_1%"]["p90"], rows[n]["to_1%"]["median"], rows[n]["to_1%"]["never"]))
    ours = rows["pattern"]["to_1%"]
    median, p90 = rows[by_median]["to_1%"]["median"], rows[by_p90]["to_1%"]["p90"]
    beats = ours["median"] < median and ours["p90"] < p90
    return (
        f"pattern {'BEATS' if beats else 'DOES NOT BEAT'} Kernel Tuner's best here: median to 1% "
        f"{_num(ours['median'])} vs {_num(median)} ({by_median[3:]}), p90 {_num(ours['p90'])} vs {_num(p90)} "
        f"({by_p90[3:]})"
    )


def _num(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.0f}" if x == int(x) else f"{x:.1f}"


def format_sweep(result: dict[str, Any], budget: int) -> str:
    """One sweep's table: evaluations to 1% / 2% / 5% (median, p90, runs that never did), best after 25."""
    lines = [
        f"{result['sweep']} ({result['study']}): {result['feasible']} feasible configs, best "
        f"{result['best']:.1f} TFLOPS; budget {budget} evaluations",
        f"{'search':<24} {'seeds':>5}  {'to 1% med/p90 (never)':>21}  {'to 2%':>15}  {'to 5%':>15}  "
        f"{'best@25':>7}  {'evals':>5}  {'stalled':>7}  {'s/run':>6}",
    ]

    def cell(d: dict[str, Any]) -> str:
        return f"{_num(d['median']):>4} {_num(d['p90']):>4} ({d['never']:>2})"

    for name, row in result["rows"].items():
        lines.append(
            f"{name:<24} {row['runs']:>5}  {cell(row['to_1%']):>21}  {cell(row['to_2%']):>15}  "
            f"{cell(row['to_5%']):>15}  {row['best_at_25']:>7.3f}  {_num(row['evaluations']):>5}  {row['stalled']:>7}  "
            f"{row['seconds'] / row['runs']:>6.1f}"
        )
    lines.append(verdict(result))
    return "\n".join(lines) + "\n"


def _seed_counts(items: Sequence[str]) -> dict[str, int]:
    """``STRATEGY=N`` pairs: fewer seeds for a slow strategy."""
    out = {}
    for item in items:
        name, _, n = item.partition("=")
        out[name] = int(n)
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.search.kernel_tuner_compare", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seeds", type=int, default=20, help="seeds 0..N-1 per search (default 20)")
    parser.add_argument("--budget", type=int, default=50, help="evaluations per run: Kernel Tuner's max_fevals")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), help="Kernel Tuner strategies")
    parser.add_argument("--sweeps", nargs="+", default=list(SWEEPS), choices=list(SWEEPS), metavar="SWEEP")
    parser.add_argument("--fewer-seeds", nargs="*", default=[], metavar="STRATEGY=N", help="N seeds for STRATEGY")
    parser.add_argument("--jobs", type=int, default=mp.cpu_count(), help="processes for Kernel Tuner's runs")
    parser.add_argument("--cache-dir", help="where the cache files go (default: a temporary directory)")
    parser.add_argument("-o", "--output", help="write every figure (per-seed ones too) to this JSON file")
    args = parser.parse_args(argv)
    args.seed_counts = _seed_counts(args.fewer_seeds)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    kernel_tuner = import_kernel_tuner()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        args.cache_dir = args.cache_dir or tmp
        Path(args.cache_dir).mkdir(parents=True, exist_ok=True)
        results = []
        for name in args.sweeps:
            results.append(compare_sweep(name, args, lambda line: print(line, file=sys.stderr, flush=True)))
            print(format_sweep(results[-1], args.budget), flush=True)
    if args.output:
        meta = {"kernel_tuner": kernel_tuner.__version__, "date": datetime.now(UTC).isoformat(timespec="seconds")}
        meta |= {"seeds": args.seeds, "budget": args.budget, "fewer_seeds": args.seed_counts, "argv": sys.argv[1:]}
        Path(args.output).write_text(json.dumps({**meta, "sweeps": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
