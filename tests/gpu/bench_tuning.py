"""Tuning throughput on a GPU machine: exhaustive sweeps of the reduced sm90 space, timed end to end.

    python -m tests.gpu.bench_tuning --out DIR [--shape NAME ...] [--gpus 0|all] [--compile-workers N] [--lanes N]
    python -m tests.gpu.bench_tuning --out DIR --scaling [--shape NAME] [--lanes N]

Each sweep is ``flashtune tune --family sm90_small --sampler grid --trials 100000 --top-k 0`` on one
shape with a cold cubin cache (its own cache folder), into ``DIR/<shape>.db`` (a stored study that
``flashtune replay`` can use as an oracle afterwards). Prints, per sweep: evaluated configs, wall time,
configs/s, the GPU-busy share and the time spent waiting for compiles, as the tuner itself reports them
(its ``throughput:`` line), and writes the logs and a JSON summary under DIR. ``--lanes N`` measures on
N lanes of GPU 0 (tests/gpu/lanes_on_one_gpu.py: a stand-in for N GPUs).

``--scaling`` measures how the sweep scales from one GPU to all of the host's (or, with ``--lanes N``,
from one lane to N lanes on GPU 0), each run with its share of the host's cores: one GPU with
cores / GPUs - 1 compile workers against all GPUs with cores - 1 (one core left for the loop). A short
warm-up study first compiles CuPy's kernels, so that both runs start on equal terms. Prints the
ratio of their configs/s, end to end and as the tuner reports it. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPACE = REPO / "tests" / "data" / "sm90_small.toml"

#: name -> problem flags of flashtune tune
SHAPES = {
    "causal-n4096": [
        "--dtype",
        "fp16",
        "--head-dim",
        "128",
        "--causal",
        "--batch",
        "4",
        "--seqlen",
        "4096",
        "--heads",
        "16",
    ],  # the shape of tests/data/h200_sm90_small_grid.db
    "causal-n512": [
        "--dtype",
        "fp16",
        "--head-dim",
        "128",
        "--causal",
        "--batch",
        "32",
        "--seqlen",
        "512",
        "--heads",
        "16",
    ],
    "bf16-full-n2048": ["--dtype", "bf16", "--head-dim", "128", "--batch", "8", "--seqlen", "2048", "--heads", "16"],
}

_THROUGHPUT = re.compile(
    r"throughput: (\d+) configs in (\d+) s = ([\d.]+)/s on (\d+) GPUs?, GPU busy (\d+)% "
    r"\((\d+)% while measuring\); per GPU: measuring (\d+) s, waiting for compiles (\d+) s "
    r"\(preparing \d+ s\); the loop: search (\d+) s, storage (\d+) s"
)


def sweep(name: str, out: Path, gpus: str, workers: int, lanes: int = 1, trials: int = 100_000) -> dict:
    tag = gpus.replace(",", "_") + ("" if lanes == 1 else f"-lanes-{lanes}")
    cache = Path(f"/tmp/flashtune-bench-cache-{name}-{tag}")
    shutil.rmtree(cache, ignore_errors=True)
    db = out / f"{name}{'' if tag == '0' else '-gpus-' + tag}.db"
    db.unlink(missing_ok=True)
    entry = ["tuner"] if lanes == 1 else ["tests.gpu.lanes_on_one_gpu", str(lanes)]
    cmd = [
        sys.executable,
        "-m",
        *entry,
        "tune",
        "--family",
        "sm90_small",
        "--sampler",
        "grid",
        "--trials",
        str(trials),
        "--compile-workers",
        str(workers),
        "--top-k",
        "0",
        "--gpus",
        gpus,
        "--storage",
        f"sqlite:///{db}",
        "--study",
        f"grid-{name}",
        *SHAPES[name],
    ]
    env = {**os.environ, "FLASHTUNE_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    proc = subprocess.run(cmd, check=False, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    log = out / f"{db.stem}.log"
    log.write_text(proc.stdout + proc.stderr)
    runs = [m.groups() for m in _THROUGHPUT.finditer(proc.stderr)]
    evaluated = sum(int(r[0]) for r in runs)
    row = {
        "shape": name,
        "gpus": gpus,
        "lanes": lanes,
        "compile_workers": workers,
        "exit": proc.returncode,
        "wall_s": round(wall, 1),
        "evaluated": evaluated,
        "configs_per_s": round(evaluated / wall, 2) if wall else 0.0,
        "per_process": [
            {
                "evaluated": int(r[0]),
                "wall_s": int(r[1]),
                "configs_per_s": float(r[2]),
                "gpus": int(r[3]),
                "gpu_busy": int(r[4]) / 100,
                "gpu_busy_measuring": int(r[5]) / 100,
                "measure_s": int(r[6]),
                "compile_wait_s": int(r[7]),
                "search_s": int(r[8]),
                "storage_s": int(r[9]),
            }
            for r in runs
        ],
        "storage": str(db),
    }
    print(
        f"[{time.strftime('%H:%M:%S')}] {name} on GPUs {gpus} ({lanes} lane(s) each): exit {proc.returncode}, {evaluated} configs in "
        f"{wall:.0f} s",
        flush=True,
    )
    if proc.returncode != 0:
        print(proc.stderr[-3000:], flush=True)
    return row


def _table(rows: list[dict]) -> None:
    print(
        f"{'shape':<18} {'GPUs':>5} {'lanes':>5} {'workers':>7} {'configs':>7} {'wall s':>7} {'configs/s':>9}  "
        "per process: configs/s, GPU busy (while measuring), per GPU: measuring s, compile wait s; search s, "
        "storage s"
    )
    for r in rows:
        procs = "; ".join(
            f"{p['configs_per_s']:.2f}, {100 * p['gpu_busy']:.0f}% "
            f"({100 * p['gpu_busy_measuring']:.0f}%), {p['measure_s']}, {p['compile_wait_s']}; "
            f"{p['search_s']}, {p['storage_s']}"
            for p in r["per_process"]
        )
        print(
            f"{r['shape']:<18} {r['gpus']:>5} {r['lanes']:>5} {r['compile_workers']:>7} {r['evaluated']:>7} "
            f"{r['wall_s']:>7.0f} {r['configs_per_s']:>9.2f}  {procs}"
        )


def _gpu_count() -> int:
    from tuner.run import Worker, WorkerError

    try:
        with Worker(device=0) as worker:
            return int(worker.device_count(timeout_s=120))
    except WorkerError as e:
        raise SystemExit(f"--scaling: no GPU to count: {e}") from None


def scaling(shape: str, out: Path, lanes: int) -> list[dict]:
    """One GPU (lane) against all of them (``lanes`` on GPU 0), each with its share of the cores."""
    n = lanes if lanes > 1 else _gpu_count()
    if n < 2:
        raise SystemExit("--scaling needs a host of two or more GPUs, or --lanes 2 or more")
    cores = len(os.sched_getaffinity(0))
    share, full = max(1, cores // n - 1), max(1, cores - 1)
    print(
        f"{cores} cores, {n} {'lanes on GPU 0' if lanes > 1 else 'GPUs'}: one with {share} compile workers, "
        f"all with {full}",
        flush=True,
    )
    if sweep(shape, out / "warm-up", "0", share, trials=3)["exit"] != 0:  # CuPy's kernels, once per machine
        raise SystemExit("--scaling: the warm-up study failed (its log is under warm-up/)")
    one = sweep(shape, out / "one", "0", share)
    many = sweep(shape, out / "all", "0" if lanes > 1 else "all", full, lanes)
    return [one, many]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--shape", action="append", choices=sorted(SHAPES))
    parser.add_argument("--gpus", default="0")
    parser.add_argument("--compile-workers", type=int, default=15)
    parser.add_argument("--lanes", type=int, default=1, help="measuring lanes, all on GPU 0 (needs --gpus 0)")
    parser.add_argument("--scaling", action="store_true", help="one GPU against all (see above)")
    args = parser.parse_args(argv)
    if args.lanes < 1 or (args.lanes > 1 and args.gpus != "0"):
        parser.error("--lanes takes a positive count, and more than 1 only with --gpus 0")
    if args.scaling and len(args.shape or []) > 1:
        parser.error("--scaling measures one shape")
    shapes = args.shape or ["causal-n4096"]
    for folder in [args.out] + ([args.out / f for f in ("warm-up", "one", "all")] if args.scaling else []):
        folder.mkdir(parents=True, exist_ok=True)
    installed = REPO / "search_spaces" / "sm90_small.toml"
    copied = not installed.exists()
    if copied:
        shutil.copy(SPACE, installed)
    try:
        if args.scaling:
            rows = scaling(shapes[0], args.out, args.lanes)
        else:
            rows = [sweep(name, args.out, args.gpus, args.compile_workers, args.lanes) for name in shapes]
    finally:
        if copied:
            installed.unlink()
    name = "scaling" if args.scaling else f"gpus_{args.gpus.replace(',', '_')}_lanes_{args.lanes}"
    (args.out / f"bench_tuning_{name}.json").write_text(json.dumps(rows, indent=1))
    _table(rows)
    if args.scaling:
        one, many = rows
        tuner = [sum(p["configs_per_s"] for p in r["per_process"]) for r in rows]
        print(
            f"scaling, all against one: {many['configs_per_s'] / max(one['configs_per_s'], 1e-9):.2f}x end to end, "
            f"{tuner[1] / max(tuner[0], 1e-9):.2f}x as the tuner reports it (target: 1.8x)"
        )
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
