"""The tuning loop's own throughput, without a GPU: does one loop keep two GPUs' worth of compiles busy?

    python -m tests.run.bench_loop [--compile-s 0.6] [--measure-s 0.02] [--workers 15] [--sampler pattern]

Runs the real loop (search, storage on a SQLite file, compile pool, GPU lanes) over the 620 configs of
the stored H200 sweep (tests/data/), with compiles that sleep ``--compile-s`` in the compile processes
and measurements that sleep ``--measure-s`` and answer from the sweep: once with one GPU lane and
``--workers`` compile processes, once with two lanes and twice the workers plus one. The pools are
started before the clock, so the figures are the loop's, not process start-up. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import optuna

import tuner.study as st
from tuner.gpu import MeasureSettings
from tuner.run import MeasureFunction, TuneSettings, compile_pool, load_oracle, tune
from tuner.run._replay import _stand_in_compile
from tuner.search import make_search
from tuner.study import open_storage, requeue_stale

DATA = Path(__file__).resolve().parents[1] / "data"


def sleeping_compile(space_path, config, problem, device):
    time.sleep(float(os.environ["FLASHTUNE_BENCH_COMPILE_S"]))
    return _stand_in_compile(space_path, config, problem, device)


def run(lanes: int, workers: int, measure_s: float, directory: str, sampler: str = "grid") -> float:
    """Configs per second of one sweep."""
    oracle = load_oracle(
        open_storage(f"sqlite:///{DATA / 'h200_sm90_small_grid.db'}", create=False),
        "grid-small",
        DATA / "sm90_small.toml",
    )
    storage = open_storage(f"sqlite:///{directory}/lanes-{lanes}.db", stale_trial_callback=requeue_stale)
    study = st.open_study(
        storage=storage,
        name="bench",
        space=oracle.space,
        problem=oracle.problem,
        gpu={**oracle.device.to_dict(), "name": oracle.device.name or "H200"},
        sampler=optuna.samplers.RandomSampler(0),
    )

    def measure(job):
        time.sleep(measure_s)
        return oracle.measure(job)

    pool = compile_pool(workers)
    try:
        list(pool.map(time.sleep, [0.5] * workers))  # every process started and idle
        summary = tune(
            study,
            oracle.space,
            oracle.problem,
            oracle.device,
            [MeasureFunction(measure) for _ in range(lanes)],
            TuneSettings(n_trials=None, compile_workers=workers, measure=MeasureSettings(seed=1)),
            search=make_search(sampler, oracle.space, oracle.problem, oracle.device, 1),
            compiler=sleeping_compile,
            pool=pool,
        )
    finally:
        pool.shutdown()
    print(f"{lanes} lane(s), {workers} compile processes: {summary.stats.line()}", flush=True)
    return summary.stats.configs_per_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile-s", type=float, default=0.6)
    parser.add_argument("--measure-s", type=float, default=0.02)
    parser.add_argument("--workers", type=int, default=15)
    parser.add_argument("--sampler", default="grid", help="the search that proposes (default grid: no model cost)")
    args = parser.parse_args()
    os.environ["FLASHTUNE_BENCH_COMPILE_S"] = str(args.compile_s)  # the compile processes read it
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as directory:
        one = run(1, args.workers, args.measure_s, directory, args.sampler)
        two = run(2, 2 * args.workers + 1, args.measure_s, directory, args.sampler)
    ideal = args.workers / args.compile_s
    print(
        f"one lane {one:.1f} configs/s (compiles allow {ideal:.1f}), two lanes {two:.1f} "
        f"({(2 * args.workers + 1) / args.compile_s:.1f}): {two / one:.2f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
