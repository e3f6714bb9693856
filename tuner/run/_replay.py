"""Replay: the real tuning loop with every measurement looked up in a stored study that holds the whole space.

``flashtune replay --storage URL --study NAME`` runs :class:`~._loop.TuneLoop` as a tuning run
would (same search strategies, static checks, exploration, budget accounting, the default config
first) on an in-memory study, but a trial's TFLOPS come from the stored study (an exhaustive
``--sampler grid`` sweep) instead of the GPU, and nothing is compiled. Kernel Tuner calls this
simulation mode. It answers, without a GPU and for many seeds, how many evaluations a search
needs to come near the best config the sweep found. A run's every random choice follows its seed,
so the same seeds give the same figures, in any process.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from .. import study as st
from ..compile import CompiledKernel, CompileOutcome, Resources
from ..devices import DeviceLimits
from ..errors import FlashtuneError
from ..gpu import MeasureJob, MeasureResult, MeasureSettings
from ..outcome import Status
from ..problem import Problem
from ..search import check_search, make_search
from ..space import Config, Space, SpaceError, config_key, load_space
from ._contracts import MeasureFunction
from ._loop import TuneLoop, TuneSettings
from ._threads import ignore_stop_signals

__all__ = [
    "CHECKPOINTS",
    "THRESHOLDS",
    "Oracle",
    "ReplayError",
    "ReplayRun",
    "format_markdown",
    "format_table",
    "load_oracle",
    "replay",
    "summarize",
]

THRESHOLDS = (0.01, 0.02, 0.05)  # within 1%, 2%, 5% of the stored best
CHECKPOINTS = (25, 50, 100)  # best-so-far after this many evaluations


class ReplayError(FlashtuneError, ValueError):
    """The stored study cannot serve as an oracle (not flashtune's, another space, a config it never measured)."""


@dataclass(frozen=True)
class Oracle:
    """What a stored sweep measured: config key -> TFLOPS (None: the config failed: wrong result, ...)."""

    study_name: str
    space: Space
    problem: Problem
    device: DeviceLimits
    results: dict[str, float | None]

    @property
    def best(self) -> float:
        return max(v for v in self.results.values() if v is not None)

    def tflops(self, config: Config) -> float | None:
        """What the study measured for ``config`` (None: it failed)."""
        key = config_key(config)
        if key not in self.results:
            raise ReplayError(
                f"study {self.study_name!r} never measured config {config} (it holds {len(self.results)} "
                "configs): replay needs a study that holds every feasible config (flashtune tune "
                "--sampler grid --trials 100000)"
            )
        return self.results[key]

    def describe(self) -> str:
        """One line: what the oracle is, its best and the default's share of it."""
        feasible = sum(1 for v in self.results.values() if v is not None)
        default = self.results.get(config_key(self.space.defaults(problem=self.problem, device=self.device)))
        return (
            f"replay of {self.study_name}: {self.problem.slug()}, {feasible} measured configs, best "
            f"{self.best:.1f} TFLOPS" + (f", default {default / self.best:.3f} of it" if default else "")
        )

    def measure(self, job: MeasureJob) -> MeasureResult:
        tflops = self.tflops(job.config)
        if tflops is None:
            return MeasureResult(status=Status.WRONG_RESULT, detail="failed in the stored study")
        return MeasureResult(status=Status.OK, tflops=tflops, latency_ms=self.problem.flops / (tflops * 1e9), reps=1)


def load_oracle(
    storage: optuna.storages.BaseStorage,
    study_name: str,
    space_path: str | Path | None = None,
    *,
    storage_url: str | None = None,
) -> Oracle:
    """The stored study as an oracle; ``space_path`` when its family's space file is not in search_spaces/;
    ``storage_url``: where ``storage`` is, for the hint when the study is not there."""
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        where = f"in {st.mask_url(storage_url)}" if storage_url else "in that storage"
        raise ReplayError(f"no study named {study_name!r} {where}; {st.listing_hint(storage_url)}") from None
    attrs = study.user_attrs
    if not isinstance(attrs.get(st.MADE_BY), dict):
        raise ReplayError(f"study {study_name!r} was not made by flashtune")
    try:
        space = load_space(space_path or attrs[st.FAMILY])
    except SpaceError as e:
        raise ReplayError(f"{e}; give the space file the study was measured with (--space FILE)") from None
    if attrs.get(st.SPACE_DIGEST) != st.space_digest(space):
        raise ReplayError(
            f"study {study_name!r} was measured on other knobs than {space.path}: give the space file "
            "it was measured with (--space FILE)"
        )
    results: dict[str, float | None] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        if not t.params or st.DUPLICATE_OF in t.user_attrs or Status.of(t) is Status.INFEASIBLE:
            continue
        results.setdefault(config_key(t.params), t.value if t.state == TrialState.COMPLETE else None)
    if not any(v is not None for v in results.values()):
        raise ReplayError(f"study {study_name!r} holds no successful trial")
    return Oracle(
        study_name=study_name,
        space=space,
        problem=st.study_problem(study),
        device=DeviceLimits.from_info(attrs[st.GPU]),
        results=results,
    )


@dataclass
class ReplayRun:
    """One replayed tuning run: the TFLOPS of each evaluated config, in order, and the search's counts."""

    sampler: str
    seed: int
    values: list[float | None] = field(default_factory=list)
    best: float = 0.0  # the oracle's best TFLOPS
    asks: int = 0
    repeats: int = 0
    infeasible: int = 0
    explorations: int = 0

    def evaluations_to(self, target: float) -> int | None:
        """Evaluations until one reached ``target`` TFLOPS (None: never)."""
        for i, v in enumerate(self.values, 1):
            if v is not None and v >= target:
                return i
        return None

    def best_after(self, n: int) -> float | None:
        seen = [v for v in self.values[:n] if v is not None]
        return max(seen) if seen else None


def _stand_in_compile(
    space_path: str, config: dict[str, int], problem: Problem, device: DeviceLimits
) -> CompileOutcome:
    resources = Resources(registers=0, spill_store_bytes=0, spill_load_bytes=0, stack_bytes=0, static_smem_bytes=0)
    return CompileOutcome(
        status=Status.OK,
        payload=CompiledKernel(
            cubin_path="", entry="", arch="", options=(), resources=resources, seconds=0.0, cached=True
        ),
    )


def replay_one(oracle: Oracle, sampler: str, seed: int, budget: int, window: int = 1) -> ReplayRun:
    """One tuning run of ``budget`` evaluations on an in-memory study, measured by the oracle. ``window``
    configs are in flight at once, as with a real run's compile-ahead (its proposals are made before the
    results of the others are known); 1: each result is known before the next proposal."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = st.open_study(
        storage=optuna.storages.InMemoryStorage(),
        name="replay",
        space=oracle.space,
        problem=oracle.problem,
        gpu={**oracle.device.to_dict(), "name": oracle.device.name or "replay"},
        sampler=optuna.samplers.RandomSampler(seed=seed),
    )
    search = make_search(sampler, oracle.space, oracle.problem, oracle.device, seed)
    settings = TuneSettings(
        n_trials=budget, compile_workers=0, compile_ahead=window, measure=MeasureSettings(seed=seed)
    )
    unmeasured: list[ReplayError] = []

    def measure(job: MeasureJob) -> MeasureResult:
        try:
            return oracle.measure(job)
        except ReplayError as e:  # the stored study is no exhaustive sweep: no replay can be trusted
            unmeasured.append(e)
            raise

    loop = TuneLoop(
        study,
        oracle.space,
        oracle.problem,
        oracle.device,
        MeasureFunction(measure),
        settings,
        search=search,
        compiler=_stand_in_compile,
        seed=seed,
    )
    summary = loop.run()
    if unmeasured:
        raise unmeasured[0]
    evaluated = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        if st.is_evaluated(t)
    ]
    evaluated.sort(key=lambda t: t.datetime_complete)  # the order the loop measured them in
    return ReplayRun(
        sampler=sampler,
        seed=seed,
        values=[t.value for t in evaluated],
        best=oracle.best,
        asks=search.stats.asks,
        repeats=search.stats.repeats,
        infeasible=search.stats.infeasible,
        explorations=summary.explorations,
    )


def _replay_task(
    oracle: Oracle | Callable[[int], Oracle], sampler: str, seed: int, budget: int, window: int
) -> ReplayRun:
    return replay_one(oracle if isinstance(oracle, Oracle) else oracle(seed), sampler, seed, budget, window)


def replay(
    oracle: Oracle | Callable[[int], Oracle],
    samplers: Sequence[str],
    seeds: Sequence[int],
    budget: int,
    *,
    window: int = 1,
    jobs: int = 1,
    progress=None,
) -> list[ReplayRun]:
    """Every (sampler, seed) run, in ``jobs`` processes. ``oracle``: one oracle, or a function of the seed
    that makes each run's own (a synthetic landscape per seed; picklable when ``jobs`` > 1)."""
    first = oracle if isinstance(oracle, Oracle) else oracle(seeds[0])
    for name in samplers:
        check_search(name, first.space)  # an unknown name, or missing dependencies: say so before any run
    tasks = [(name, seed) for name in samplers for seed in seeds]
    if jobs <= 1:
        runs = []
        for name, seed in tasks:
            runs.append(_replay_task(oracle, name, seed, budget, window))
            if progress:
                progress(runs[-1])
        return runs
    # never more processes than runs; leaving the pool (done, failed or interrupted) terminates and
    # reaps every one of them
    with mp.get_context("spawn").Pool(min(jobs, len(tasks)), initializer=ignore_stop_signals) as pool:
        runs = []
        for run in pool.imap(_replay_star, [(oracle, name, seed, budget, window) for name, seed in tasks]):
            runs.append(run)
            if progress:
                progress(run)
        return runs


def _replay_star(arguments: tuple) -> ReplayRun:
    return _replay_task(*arguments)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summarize(oracle: Oracle | None, runs: Sequence[ReplayRun]) -> list[dict[str, Any]]:
    """Per sampler: evaluations to each threshold (median, 90th percentile, runs that never got there; a run
    that never did counts as infinity in the percentiles), best-so-far after each checkpoint (fraction of
    the best, median), and the worst run's repeats per new config. Each run is judged against its own
    oracle's best (``oracle``, if given, for runs that do not know it)."""
    rows = []
    for name in dict.fromkeys(r.sampler for r in runs):
        mine = [r for r in runs if r.sampler == name]
        row: dict[str, Any] = {"sampler": name, "runs": len(mine)}
        for threshold in THRESHOLDS:
            counts = [r.evaluations_to(_best(oracle, r) * (1 - threshold)) for r in mine]
            finite = [float(c) if c is not None else math.inf for c in counts]
            row[f"to_{threshold:.0%}"] = {
                "median": statistics.median(finite),
                "p90": _percentile(finite, 0.9),
                "never": sum(c is None for c in counts),
            }
        for n in CHECKPOINTS:
            bests = [(r.best_after(n) or 0.0) / _best(oracle, r) for r in mine]
            row[f"best_at_{n}"] = statistics.median(bests)
        row["repeats_per_new"] = max(r.repeats / max(1, len(r.values)) for r in mine)
        row["asks_per_run"] = statistics.median(r.asks for r in mine)
        rows.append(row)
    return rows


def _best(oracle: Oracle | None, run: ReplayRun) -> float:
    if run.best:
        return run.best
    if oracle is None:
        raise ReplayError(f"run {run.sampler}/{run.seed} does not know its oracle's best")
    return oracle.best


def format_table(oracle: Oracle | None, rows: Sequence[dict[str, Any]], budget: int, *, title: str = "") -> str:
    """The summary as text; the first line describes ``oracle`` (or is ``title``)."""
    lines = [
        f"{title or oracle.describe()}; budget {budget} evaluations",
        "evaluations to come within 1% / 2% / 5% of the best: median, 90th percentile (runs that never did)",
        f"{'sampler':<8} {'runs':>4}  {'within 1%':>17}  {'within 2%':>17}  {'within 5%':>17}  "
        f"{'best@25':>7} {'best@50':>7} {'best@100':>8}  {'repeats/new':>11}",
    ]

    def cell(d: dict[str, float]) -> str:
        def num(x: float) -> str:
            return "inf" if math.isinf(x) else f"{x:.0f}" if x == int(x) else f"{x:.1f}"

        return f"{num(d['median']):>5} {num(d['p90']):>5} ({d['never']:>2})"

    for row in rows:
        lines.append(
            f"{row['sampler']:<8} {row['runs']:>4}  {cell(row['to_1%']):>17}  {cell(row['to_2%']):>17}  "
            f"{cell(row['to_5%']):>17}  {row['best_at_25']:>7.3f} {row['best_at_50']:>7.3f} "
            f"{row['best_at_100']:>8.3f}  {row['repeats_per_new']:>11.2f}"
        )
    return "\n".join(lines) + "\n"


def format_markdown(rows: Sequence[dict[str, Any]], *, label: str = "") -> str:
    """The summary as Markdown table rows (BENCHMARKS.md): ``label`` first, then per sampler evaluations to
    1% / 2% / 5% (median / p90, runs that never got there), best-so-far at 25 / 50 / 100, repeats per new."""

    def cell(d: dict[str, float]) -> str:
        def num(x: float) -> str:
            return "—" if math.isinf(x) else f"{x:.0f}" if x == int(x) else f"{x:.1f}"

        return f"{num(d['median'])} / {num(d['p90'])}" + (f" ({d['never']} never)" if d["never"] else "")

    return "".join(
        f"| {label} | {row['sampler']} | {cell(row['to_1%'])} | {cell(row['to_2%'])} | {cell(row['to_5%'])} | "
        f"{row['best_at_25']:.3f} / {row['best_at_50']:.3f} / {row['best_at_100']:.3f} | "
        f"{row['repeats_per_new']:.2f} |\n"
        for row in rows
    )
