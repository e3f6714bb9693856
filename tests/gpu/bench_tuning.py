"""Tuning throughput on a GPU machine: exhaustive sweeps of the reduced sm90 space, timed end to end.

    python -m tests.gpu.bench_tuning --out DIR [--shape NAME ...] [--gpus 0|all] [--compile-workers N] [--lanes N]

Each sweep is ``flashtune tune --family sm90_small --sampler grid --trials 100000 --top-k 0`` on one
shape with a cold cubin cache (its own cache folder), into ``DIR/<shape>.db`` (a stored study that
``flashtune replay`` can use as an oracle afterwards). Prints, per sweep: evaluated configs, wall time,
configs/s, the GPU-busy share and the time spent waiting for compiles, as the tuner itself reports them
(its ``throughput:`` line), and writes the logs and a JSON summary under DIR. ``--lanes N`` measures on
N lanes of GPU 0 (tests/gpu/lanes_on_one_gpu.py: a stand-in for N GPUs). Not collected by pytest.
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
    "causal-n4096": ["--dtype", "fp16", "--head-dim", "128", "--causal", "--batch", "4", "--seqlen", "4096",
                     "--heads", "16"],  # the shape of tests/data/h200_sm90_small_grid.db
    "causal-n512": ["--dtype", "fp16", "--head-dim", "128", "--causal", "--batch", "32", "--seqlen", "512",
                    "--heads", "16"],
    "bf16-full-n2048": ["--dtype", "bf16", "--head-dim", "128", "--batch", "8", "--seqlen", "2048", "--heads", "16"],
}

_THROUGHPUT = re.compile(r"throughput: (\d+) configs in (\d+) s = ([\d.]+)/s on (\d+) GPUs?, GPU busy (\d+)% "
                         r"\((\d+)% while measuring\); per GPU: measuring (\d+) s, waiting for compiles (\d+) s "
                         r"\(preparing \d+ s\); the loop: search (\d+) s, storage (\d+) s")


def sweep(name: str, out: Path, gpus: str, workers: int, lanes: int = 1) -> dict:
    tag = gpus.replace(',', '_') + ('' if lanes == 1 else f'-lanes-{lanes}')
    cache = Path(f"/tmp/flashtune-bench-cache-{name}-{tag}")
    shutil.rmtree(cache, ignore_errors=True)
    db = out / f"{name}{'' if tag == '0' else '-gpus-' + tag}.db"
    db.unlink(missing_ok=True)
    entry = ["tuner"] if lanes == 1 else ["tests.gpu.lanes_on_one_gpu", str(lanes)]
    cmd = [sys.executable, "-m", *entry, "tune", "--family", "sm90_small", "--sampler", "grid", "--trials",
           "100000", "--compile-workers", str(workers), "--top-k", "0", "--gpus", gpus, "--storage",
           f"sqlite:///{db}", "--study", f"grid-{name}", *SHAPES[name]]
    env = {**os.environ, "FLASHTUNE_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    log = out / f"{db.stem}.log"
    log.write_text(proc.stdout + proc.stderr)
    runs = [m.groups() for m in _THROUGHPUT.finditer(proc.stderr)]
    evaluated = sum(int(r[0]) for r in runs)
    row = {"shape": name, "gpus": gpus, "lanes": lanes, "compile_workers": workers, "exit": proc.returncode, "wall_s": round(wall, 1),
           "evaluated": evaluated, "configs_per_s": round(evaluated / wall, 2) if wall else 0.0,
           "per_process": [{"evaluated": int(r[0]), "wall_s": int(r[1]), "configs_per_s": float(r[2]),
                            "gpus": int(r[3]), "gpu_busy": int(r[4]) / 100, "gpu_busy_measuring": int(r[5]) / 100,
                            "measure_s": int(r[6]), "compile_wait_s": int(r[7]), "search_s": int(r[8]),
                            "storage_s": int(r[9])}
                           for r in runs], "storage": str(db)}
    print(f"[{time.strftime('%H:%M:%S')}] {name} on GPUs {gpus} ({lanes} lane(s) each): exit {proc.returncode}, {evaluated} configs in "
          f"{wall:.0f} s", flush=True)
    if proc.returncode != 0:
        print(proc.stderr[-3000:], flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--shape", action="append", choices=sorted(SHAPES))
    parser.add_argument("--gpus", default="0")
    parser.add_argument("--compile-workers", type=int, default=15)
    parser.add_argument("--lanes", type=int, default=1, help="measuring lanes, all on GPU 0 (needs --gpus 0)")
    args = parser.parse_args(argv)
    if args.lanes < 1 or args.lanes > 1 and args.gpus != "0":
        parser.error("--lanes takes a positive count, and more than 1 only with --gpus 0")
    args.out.mkdir(parents=True, exist_ok=True)
    installed = REPO / "search_spaces" / "sm90_small.toml"
    copied = not installed.exists()
    if copied:
        shutil.copy(SPACE, installed)
    try:
        rows = [sweep(name, args.out, args.gpus, args.compile_workers, args.lanes) for name in args.shape or ["causal-n4096"]]
    finally:
        if copied:
            installed.unlink()
    (args.out / f"bench_tuning_gpus_{args.gpus.replace(',', '_')}_lanes_{args.lanes}.json").write_text(json.dumps(rows, indent=1))
    print(f"{'shape':<18} {'GPUs':>5} {'lanes':>5} {'workers':>7} {'configs':>7} {'wall s':>7} {'configs/s':>9}  per process: "
          "configs/s, GPU busy (while measuring), per GPU: measuring s, compile wait s; search s, storage s")
    for r in rows:
        procs = "; ".join(f"{p['configs_per_s']:.2f}, {100 * p['gpu_busy']:.0f}% "
                          f"({100 * p['gpu_busy_measuring']:.0f}%), {p['measure_s']}, {p['compile_wait_s']}; "
                          f"{p['search_s']}, {p['storage_s']}" for p in r["per_process"])
        print(f"{r['shape']:<18} {r['gpus']:>5} {r['lanes']:>5} {r['compile_workers']:>7} {r['evaluated']:>7} {r['wall_s']:>7.0f} "
              f"{r['configs_per_s']:>9.2f}  {procs}")
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
