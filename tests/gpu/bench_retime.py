"""Does the stored winner beat the default for real? Tune 5 shapes briefly, then time winner and default again.

    python -m tests.gpu.bench_retime --out DIR [--budget 90] [--shape NAME ...] [--configs FILE] [--repeats 10]

Per shape, ``flashtune tune --family sm90 --top-k 5`` (the real CLI: the pattern search, then the re-timing
that stores a winner only where it beats the default beyond noise) runs for its share of ``--budget``
seconds (tuning stops at ``--timeout``; the re-timing follows it), into ``DIR/retime.db``. Then, in one GPU
process apart from the tuner's, the stored winner and the default are measured ``--repeats`` times
interleaved (winner, default, default, winner, ...: each pair in alternating order, so that drift falls on
both alike), each time on inputs of its own, and a table is printed: per shape, the stored verdict, the
two median latencies, the median of the paired ratios (default ms / winner ms) and whether the winner is
not slower (ratio >= 1 - 1%: the spread of two timings of one kernel). ``--configs FILE`` (JSON: shape name
-> config) skips tuning and compares the given configs with the default instead. Writes
``DIR/bench_retime.json``. Needs a GPU with sm_90 (the family is sm90). Not collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOT_SLOWER = 0.01  # the winner counts as not slower within this share (two timings of one kernel differ so)
START_UP_S = 12.0  # per shape: process start, device query, first compiles (BENCHMARKS.md)

#: name -> (problem flags of flashtune tune): real-model prefill shapes unlike the sweeps' own
SHAPES = {
    "d64-fp16-n4096": ("--dtype", "fp16", "--head-dim", "64", "--batch", "4", "--seqlen", "4096", "--heads", "16"),
    "d128-bf16-causal-gqa32x8-n8192": (
        "--dtype",
        "bf16",
        "--head-dim",
        "128",
        "--causal",
        "--batch",
        "1",
        "--seqlen",
        "8192",
        "--heads",
        "32",
        "--kv-heads",
        "8",
    ),
    "d128-fp16-n577": ("--dtype", "fp16", "--head-dim", "128", "--batch", "16", "--seqlen", "577", "--heads", "16"),
    "d256-bf16-causal-n2048": (
        "--dtype",
        "bf16",
        "--head-dim",
        "256",
        "--causal",
        "--batch",
        "4",
        "--seqlen",
        "2048",
        "--heads",
        "8",
    ),
    "d64-bf16-n4608": ("--dtype", "bf16", "--head-dim", "64", "--batch", "2", "--seqlen", "4608", "--heads", "24"),
}


def _problem(flags: tuple[str, ...]):
    from tuner.cli._args import problem_from
    from tuner.cli._parser import build_parser

    return problem_from(build_parser().parse_args(["tune", *flags]))  # as flashtune tune reads them


def tune(name: str, out: Path, seconds: float, workers: int) -> None:
    """One brief tuning run of shape ``name`` into DIR/retime.db, study ``retime-<name>``."""
    cmd = [sys.executable, "-m", "tuner", "tune", "--family", "sm90", "--trials", "1000", "--top-k", "5"]
    cmd += ["--compile-workers", str(workers), "--timeout", f"{max(5.0, seconds):.0f}", "--seed", "0"]
    cmd += ["--storage", f"sqlite:///{out / 'retime.db'}", "--study", f"retime-{name}", *SHAPES[name]]
    with open(out / f"tune-{name}.log", "w") as log:
        rc = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:
        print(f"{name}: flashtune tune exited {rc}; see {out / f'tune-{name}.log'}", file=sys.stderr)


def stored_winner(out: Path, name: str) -> tuple[dict[str, int] | None, str]:
    """(the stored winner's config, the stored verdict) of shape ``name``'s study."""
    import optuna

    import tuner.study as st

    storage = optuna.storages.RDBStorage(f"sqlite:///{out / 'retime.db'}")
    try:
        study = optuna.load_study(study_name=f"retime-{name}", storage=storage)
    except KeyError:
        return None, "no study"
    entry = st.winner(study)
    if not entry:
        return None, "no winner"
    return dict(entry["config"]), st.winner_verdict(entry) or entry.get("source", "")


def interleaved(worker, jobs: dict[str, object], repeats: int) -> dict[str, list[float]]:
    """``repeats`` latencies (ms) of each job, the pair's order alternating every repeat."""
    samples: dict[str, list[float]] = {key: [] for key in jobs}
    order = list(jobs)
    for r in range(repeats):
        for key in order if r % 2 == 0 else order[::-1]:
            result = worker.measure(jobs[key], timeout_s=120)
            if not (result.ok and result.latency_ms is not None):
                raise SystemExit(f"{key}: measuring failed: {result.status} {result.detail[:200]}")
            samples[key].append(result.latency_ms)
    return samples


def compare_shape(worker, device, name: str, winner: dict[str, int], repeats: int) -> dict[str, object]:
    """The stored winner against the default of shape ``name``, ``repeats`` times interleaved."""
    from tuner.compile import compile_outcome
    from tuner.gpu import MeasureSettings, measure_job_for
    from tuner.space import load_space

    space = load_space("sm90")
    problem = _problem(SHAPES[name])
    settings = MeasureSettings(check=True, fresh_inputs=True)
    worker.prepare(problem, settings)
    configs = {"winner": space.validate(winner), "default": space.defaults(problem.head_dim)}
    jobs = {}
    for key, config in configs.items():
        compiled = compile_outcome(str(space.path), config, problem, device)
        if not (compiled.ok and compiled.payload is not None):
            raise SystemExit(f"{name}: the {key} config does not compile: {compiled.reason}")
        jobs[key] = measure_job_for(space, config, problem, device, compiled.payload, settings, tag=f"bench-{key}")
    samples = interleaved(worker, jobs, repeats)
    ratios = [d / w for d, w in zip(samples["default"], samples["winner"])]
    ratio = statistics.median(ratios)
    return {
        "shape": name,
        "is_default": configs["winner"] == configs["default"],
        "winner_ms": statistics.median(samples["winner"]),
        "default_ms": statistics.median(samples["default"]),
        "speedup": ratio,
        "not_slower": ratio >= 1 - NOT_SLOWER,
        "samples_ms": samples,
    }


def table(rows: list[dict[str, object]]) -> str:
    lines = [
        "| shape | stored verdict | winner ms | default ms | default/winner (median of pairs) | not slower |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['verdict']} | {r['winner_ms']:.4f} | {r['default_ms']:.4f} | "
            f"{r['speedup']:.3f} | {'yes' if r['not_slower'] else 'NO'} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--budget", type=float, default=90.0, help="seconds for everything, tuning and timing (90)")
    p.add_argument("--shape", action="append", choices=sorted(SHAPES), help="shapes (default: all five)")
    p.add_argument("--configs", type=Path, help="JSON: shape -> config to compare with the default (no tuning)")
    p.add_argument("--repeats", type=int, default=10, help="interleaved timings of each (default 10)")
    p.add_argument("--compile-workers", type=int, default=15)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    names = args.shape or list(SHAPES)
    t0 = time.monotonic()
    given = json.loads(args.configs.read_text()) if args.configs else None
    if given is None:
        # what the timing after tuning takes (~2 s a shape) and each run's start-up come off the budget first
        share = (args.budget - 2.0 * len(names)) / len(names) - START_UP_S
        for name in names:
            tune(name, args.out, share, args.compile_workers)
    from tuner.devices import DeviceLimits
    from tuner.run import Worker

    rows = []
    with Worker(device=0) as worker:
        device = DeviceLimits.from_info(worker.device_info(timeout_s=120))
        for name in names:
            config, verdict = (given.get(name), "given") if given is not None else stored_winner(args.out, name)
            if config is None:
                print(f"{name}: skipped ({verdict})", file=sys.stderr)
                continue
            rows.append({**compare_shape(worker, device, name, config, args.repeats), "verdict": verdict})
    print(table(rows))
    print(f"{time.monotonic() - t0:.0f} s in all", file=sys.stderr)
    (args.out / "bench_retime.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["not_slower"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
