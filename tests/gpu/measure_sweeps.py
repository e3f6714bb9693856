"""Exhaustive sweeps on one H200, back to back, as oracles for `flashtune replay` (tests/data/README.md).

    python -m tests.gpu.measure_sweeps --out DIR [--budget 480] [--only NAME ...] [--compile-workers 15]
    python -m tests.gpu.measure_sweeps --out DIR --dry-run     # no GPU: commands, feasible counts, estimate

Each sweep is the real CLI, ``flashtune tune --family <space> --sampler grid --trials 100000 --top-k 0
--compile-workers 15 ...`` on its problem, into its own SQLite file ``DIR/<db>`` and study ``grid-<name>``,
with its space file (tests/data/sweep_spaces/) copied into search_spaces/ for the run (and removed after,
unless an identical copy was there before). The sweeps share one time budget (``--budget``, seconds from
this script's start): a sweep starts only while at least ``MIN_START_S`` of it is left, and is told to stop
(``--timeout``) in time for the budget; sweeps not started are listed as skipped. Running the same command
again resumes: a finished sweep is skipped, an interrupted one carries on where it stopped (the grid sampler
proposes only the configs its study does not hold yet), on the card it started on: a database's name says which
(``h200_``/``h100_``, a planned sweep's from nvidia-smi). Sweeps marked ``held_out`` are HELD-OUT: only scored
at the end, never used to design or tune the search.

Prints each sweep's progress lines, then a table: sweep, feasible, measured, failed, best and default
TFLOPS, default / best, wall seconds; writes the sweeps' output to ``measure_sweeps.log`` and the table (with
the wall time over all runs) to ``measure_sweeps.json`` under DIR: a database per sweep run, and these two.
Not collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Self

REPO = Path(__file__).resolve().parents[2]
SPACES = REPO / "tests" / "data" / "sweep_spaces"

MIN_START_S = 45.0  # budget left below which a sweep is not started (start-up alone takes 5-25 s)
STOP_MARGIN_S = 30.0  # --timeout = what is left minus this: the tuner's start-up and wind-down
INTERRUPT_AFTER_S = 15.0  # past the budget: Ctrl-C (the tuner stores how it stopped) ...
KILL_AFTER_S = 40.0  # ... and past this, the process group is killed
LOG = "measure_sweeps.log"  # every sweep's output, appended (DIR then holds the databases, this, the JSON)

#: estimated configs/s end to end on one H200 with 15 compile workers (BENCHMARKS.md sessions 5-6: 12.6-14 at
#: d128 on a warm CuPy; d64 builds a little faster, d256 slower, and the 16k GQA kernel takes ~4 ms a launch)
RATE = {
    "sm90_sweep_d64": 14.0,
    "sm90_sweep_d64b": 14.0,
    "sm90_sweep_d64c": 14.0,
    "sm90_sweep_d128": 12.0,
    "sm90_sweep_d128c": 12.0,
    "sm90_sweep_d256": 9.0,
    "sm90_sweep_d256c": 9.0,
    "sm90_sweep_d64d": 14.0,
    "sm90_sweep_d128d": 12.0,
    "sm90_sweep_d256d": 9.0,
    "sm90_sweep_d64e": 14.0,
    "sm90_sweep_d128e": 12.0,
    "sm90_sweep_d256e": 9.0,
    "sm90_sweep_d256f": 9.0,
}
START_UP_S = 8.0  # per sweep: Python, imports, GPU worker, first compiles
COLD_CUPY_S = 25.0  # once per new machine: CuPy compiles its kernels (BENCHMARKS.md session 5)


@dataclass(frozen=True)
class Sweep:
    name: str
    space: str  # stem of a file in tests/data/sweep_spaces/, = its family name
    flags: tuple[str, ...]  # problem flags of flashtune tune
    held_out: bool = False
    rate: float | None = None  # configs/s estimate, if not the space's
    gpu: str = "h200"  # the card it was measured on: the database file's prefix

    @property
    def study(self) -> str:
        return f"grid-{self.name}"

    @property
    def db(self) -> str:
        """The database file: the space's head-dim tag (d64, d64b, d128c ...), then the name past its head dim."""
        return f"{self.gpu}_sweep_{self.space.removeprefix('sm90_sweep_')}_{self.name.split('-', 1)[1].replace('-', '_')}.db"

    @property
    def space_file(self) -> Path:
        return SPACES / f"{self.space}.toml"

    def problem(self):
        from tuner.cli._args import problem_from
        from tuner.cli._parser import build_parser

        return problem_from(build_parser().parse_args(["tune", *self.flags]))  # as flashtune tune reads them


def _flags(
    dtype: str, head_dim: int, causal: bool, batch: int, seqlen: int, heads: int, kv_heads: int | None = None
) -> tuple[str, ...]:
    out = ["--dtype", dtype, "--head-dim", str(head_dim)] + (["--causal"] if causal else [])
    out += ["--batch", str(batch), "--seqlen", str(seqlen), "--heads", str(heads)]
    return tuple(out + (["--kv-heads", str(kv_heads)] if kv_heads else []))


SWEEPS = (
    Sweep(
        "d64-fp16-causal-n4096",
        "sm90_sweep_d64",
        _flags("fp16", 64, True, 4, 4096, 16),
    ),
    Sweep(
        "d64-bf16-full-n2048",
        "sm90_sweep_d64",
        _flags("bf16", 64, False, 8, 2048, 16),
    ),
    Sweep(
        "d128-fp16-causal-b32-n512",
        "sm90_sweep_d128",
        _flags("fp16", 128, True, 32, 512, 16),
    ),
    Sweep(
        "d256-bf16-full-n2048",
        "sm90_sweep_d256",
        _flags("bf16", 256, False, 8, 2048, 16),
        held_out=True,
    ),
    Sweep(
        "d128-bf16-causal-gqa28x4-n16384",
        "sm90_sweep_d128",
        _flags("bf16", 128, True, 1, 16384, 28, 4),
        held_out=True,
        rate=9.0,
    ),
    Sweep(  # held out until scored once (2026-12-04), then a design sweep (tests/data/README.md)
        "d64-fp16-full-b16-h12-n1536",
        "sm90_sweep_d64b",
        _flags("fp16", 64, False, 16, 1536, 12),
    ),
    # sweeps 7-11, today's knobs (spaces derived from sm90.toml at 5e9dacd), all held out
    Sweep(
        "d128-bf16-causal-gqa32x8-b4-n2048",
        "sm90_sweep_d128c",
        _flags("bf16", 128, True, 4, 2048, 32, 8),
        held_out=True,
    ),
    Sweep(
        "d64-bf16-causal-b32-h12-n512",
        "sm90_sweep_d64c",
        _flags("bf16", 64, True, 32, 512, 12),
        held_out=True,
    ),
    Sweep(
        "d256-fp16-causal-b2-n4096",
        "sm90_sweep_d256c",
        _flags("fp16", 256, True, 2, 4096, 16),
        held_out=True,
    ),
    Sweep(
        "d64-fp16-full-b4-n8192",
        "sm90_sweep_d64c",
        _flags("fp16", 64, False, 4, 8192, 16),
        held_out=True,
    ),
    Sweep(
        "d128-fp16-full-b2-n8192",
        "sm90_sweep_d128c",
        _flags("fp16", 128, False, 2, 8192, 16),
        held_out=True,
        rate=9.0,
    ),
    # sweeps 12-14 (2026-12-04, session 19), the same spaces as 7-11, held out
    Sweep(
        "d128-fp16-full-b4-h24-n3000",
        "sm90_sweep_d128c",
        _flags("fp16", 128, False, 4, 3000, 24),
        held_out=True,
    ),
    Sweep(
        "d64-bf16-full-b8-h16-n1024",
        "sm90_sweep_d64c",
        _flags("bf16", 64, False, 8, 1024, 16),
        held_out=True,
    ),
    Sweep(
        "d64-fp16-causal-gqa32x8-b2-n4096",
        "sm90_sweep_d64c",
        _flags("fp16", 64, True, 2, 4096, 32, 8),
        held_out=True,
    ),
    # sweeps 15-19 (2026-12-05, session 30), held out: new shapes of the classes issue 17 names on spaces derived from
    # sm90.toml at 0dd2aa9 (the *d files); measured on an H100 (no H200 could be had)
    Sweep(
        "d64-fp16-full-b12-h12-n1536",
        "sm90_sweep_d64d",
        _flags("fp16", 64, False, 12, 1536, 12),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d64-bf16-causal-b8-h16-n2048",
        "sm90_sweep_d64d",
        _flags("bf16", 64, True, 8, 2048, 16),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d128-bf16-causal-gqa64x8-b1-n8192",
        "sm90_sweep_d128d",
        _flags("bf16", 128, True, 1, 8192, 64, 8),
        held_out=True,
        rate=9.0,
        gpu="h100",
    ),
    Sweep(
        "d128-fp16-full-b48-h16-n512",
        "sm90_sweep_d128d",
        _flags("fp16", 128, False, 48, 512, 16),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d256-fp16-full-b4-h8-n3072",
        "sm90_sweep_d256d",
        _flags("fp16", 256, False, 4, 3072, 8),
        held_out=True,
        gpu="h100",
    ),
    # sweeps 20-24: more shapes of the classes issue 17 names, on the *d spaces (sm90.toml at 0dd2aa9), measured on
    # an H200 (2026-12-06); held out until scored once (session 32), then design sweeps of the change after
    Sweep("d64-bf16-full-b16-h16-n768", "sm90_sweep_d64d", _flags("bf16", 64, False, 16, 768, 16)),
    Sweep("d64-fp16-causal-b4-h24-n3072", "sm90_sweep_d64d", _flags("fp16", 64, True, 4, 3072, 24)),
    Sweep("d128-fp16-causal-b2-h32-n3584", "sm90_sweep_d128d", _flags("fp16", 128, True, 2, 3584, 32)),
    Sweep("d128-bf16-full-gqa40x8-b2-n1280", "sm90_sweep_d128d", _flags("bf16", 128, False, 2, 1280, 40, 8)),
    Sweep("d256-bf16-causal-b4-h16-n1536", "sm90_sweep_d256d", _flags("bf16", 256, True, 4, 1536, 16)),
    # sweeps 25-29, held out: measured on an H100 (2026-12-06) before the change to the search they score
    Sweep(
        "d64-bf16-causal-gqa32x8-b1-n8192",
        "sm90_sweep_d64d",
        _flags("bf16", 64, True, 1, 8192, 32, 8),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d64-fp16-full-b32-h8-n512", "sm90_sweep_d64d", _flags("fp16", 64, False, 32, 512, 8), held_out=True, gpu="h100"
    ),
    Sweep(
        "d128-bf16-causal-gqa40x8-b1-n6144",
        "sm90_sweep_d128d",
        _flags("bf16", 128, True, 1, 6144, 40, 8),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d128-fp16-full-b8-h16-n1024",
        "sm90_sweep_d128d",
        _flags("fp16", 128, False, 8, 1024, 16),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d256-fp16-full-gqa16x4-b2-n2048",
        "sm90_sweep_d256d",
        _flags("fp16", 256, False, 2, 2048, 16, 4),
        held_out=True,
        gpu="h100",
    ),
    # sweeps 30-35, held out: measured on an H100 (2026-12-06, session 34) before the change to the search they score
    Sweep(
        "d256-bf16-causal-gqa32x8-b1-n3072",
        "sm90_sweep_d256d",
        _flags("bf16", 256, True, 1, 3072, 32, 8),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d256-fp16-causal-b8-h8-n1024",
        "sm90_sweep_d256d",
        _flags("fp16", 256, True, 8, 1024, 8),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d64-fp16-full-b8-h24-n1280",
        "sm90_sweep_d64d",
        _flags("fp16", 64, False, 8, 1280, 24),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d64-bf16-causal-b16-h12-n1024",
        "sm90_sweep_d64d",
        _flags("bf16", 64, True, 16, 1024, 12),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d128-fp16-causal-b4-h24-n2560",
        "sm90_sweep_d128d",
        _flags("fp16", 128, True, 4, 2560, 24),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d128-bf16-full-b16-h12-n768",
        "sm90_sweep_d128d",
        _flags("bf16", 128, False, 16, 768, 12),
        held_out=True,
        gpu="h100",
    ),
    # sweeps 36-39, held out: measured on an H100 (2026-12-06, session 35) before the change to the search they score,
    # in spaces with the causal unit order (the *e spaces)
    # (sweep 36 was held out until scored once; its trace then shaped the chained repairs: a design sweep since)
    Sweep(
        "d256-fp16-causal-gqa24x8-b2-n2048", "sm90_sweep_d256e", _flags("fp16", 256, True, 2, 2048, 24, 8), gpu="h100"
    ),
    Sweep(
        "d128-bf16-causal-gqa32x4-b2-n3072",
        "sm90_sweep_d128e",
        _flags("bf16", 128, True, 2, 3072, 32, 4),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d64-fp16-full-b4-h16-n2560",
        "sm90_sweep_d64e",
        _flags("fp16", 64, False, 4, 2560, 16),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d256-bf16-full-b2-h16-n4096",
        "sm90_sweep_d256e",
        _flags("bf16", 256, False, 2, 4096, 16),
        held_out=True,
        gpu="h100",
    ),
    # sweeps 40-43, held out: measured on an H100 (2026-12-06, session 36) before any change to the search they score,
    # at shapes no sweep has, in the classes where 17 in flight is slowest (d256, d128 causal GQA), and a d256 short
    # non-causal one
    Sweep(
        "d256-fp16-full-b8-h16-n1024",
        "sm90_sweep_d256f",
        _flags("fp16", 256, False, 8, 1024, 16),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d256-bf16-causal-b1-h32-n6144",
        "sm90_sweep_d256f",
        _flags("bf16", 256, True, 1, 6144, 32),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d128-fp16-causal-gqa48x8-b2-n2048",
        "sm90_sweep_d128e",
        _flags("fp16", 128, True, 2, 2048, 48, 8),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d64-bf16-causal-gqa32x4-b2-n3072",
        "sm90_sweep_d64e",
        _flags("bf16", 64, True, 2, 3072, 32, 4),
        held_out=True,
        gpu="h100",
    ),
    # sweeps 44-47, held out: measured on an H100 (2026-12-06, session 37) before any change to the search they score,
    # at classes no sweep has (d64 non-causal GQA, d128 non-causal at 16K keys, d256 batch-heavy at 512, d128 causal
    # at an odd length)
    Sweep(
        "d64-fp16-full-gqa32x8-b4-n4000",
        "sm90_sweep_d64e",
        _flags("fp16", 64, False, 4, 4000, 32, 8),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d128-bf16-full-b1-h32-n16384",
        "sm90_sweep_d128e",
        _flags("bf16", 128, False, 1, 16384, 32),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d256-fp16-full-b32-h8-n512",
        "sm90_sweep_d256f",
        _flags("fp16", 256, False, 32, 512, 8),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d128-fp16-causal-b16-h16-n1000",
        "sm90_sweep_d128e",
        _flags("fp16", 128, True, 16, 1000, 16),
        held_out=True,
        gpu="h100",
    ),
    # sweeps 48-52, held out: planned 2026-12-07 (session 39) before anything was measured, then measured on an H100,
    # at the classes where the search still misses (d128 non-causal long N: sweep 45's; d256 batch-heavy short N and
    # d128 causal GQA at window 17: sweeps 46 and 7's) at other shapes, and a diffusion-like d64 shape
    Sweep(
        "d128-fp16-full-b2-h24-n8192",
        "sm90_sweep_d128e",
        _flags("fp16", 128, False, 2, 8192, 24),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d128-bf16-full-gqa32x8-b1-n12288",
        "sm90_sweep_d128e",
        _flags("bf16", 128, False, 1, 12288, 32, 8),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d256-bf16-full-b16-h8-n768",
        "sm90_sweep_d256f",
        _flags("bf16", 256, False, 16, 768, 8),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d128-bf16-causal-gqa32x8-b2-n4096",
        "sm90_sweep_d128e",
        _flags("bf16", 128, True, 2, 4096, 32, 8),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d64-fp16-full-b2-h10-n4096",
        "sm90_sweep_d64e",
        _flags("fp16", 64, False, 2, 4096, 10),
        held_out=True,
        gpu="h100",
    ),
    # sweeps 53-56, held out: planned in session 39 after 48-52 were measured and before any was scored, then
    # measured on an H100
    Sweep(
        "d64-bf16-full-b32-h16-n577",
        "sm90_sweep_d64e",
        _flags("bf16", 64, False, 32, 577, 16),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d128-fp16-full-b4-h32-n4096",
        "sm90_sweep_d128e",
        _flags("fp16", 128, False, 4, 4096, 32),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d256-fp16-causal-gqa32x4-b1-n8192",
        "sm90_sweep_d256f",
        _flags("fp16", 256, True, 1, 8192, 32, 4),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d64-bf16-causal-b1-h16-n16384",
        "sm90_sweep_d64e",
        _flags("bf16", 64, True, 1, 16384, 16),
        held_out=True,
        gpu="h100",
    ),
    # sweeps 57-62, held out: planned 2026-12-07 (session 40) before anything was measured, to judge a search change
    # not made yet, at the classes where the search misses (d64 non-causal few waves: 52's; d128 non-causal long N:
    # 45 and 49's; d256 batch-heavy short N: 46 and 50's; d128 causal GQA: 7's) at other shapes; measured on an H100
    Sweep(
        "d64-bf16-full-b1-h12-n8192",
        "sm90_sweep_d64e",
        _flags("bf16", 64, False, 1, 8192, 12),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d128-fp16-full-gqa16x2-b2-n10240",
        "sm90_sweep_d128e",
        _flags("fp16", 128, False, 2, 10240, 16, 2),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d128-bf16-full-b3-h20-n6000",
        "sm90_sweep_d128e",
        _flags("bf16", 128, False, 3, 6000, 20),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d256-fp16-full-b24-h8-n640",
        "sm90_sweep_d256f",
        _flags("fp16", 256, False, 24, 640, 8),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d128-fp16-causal-gqa24x8-b3-n3000",
        "sm90_sweep_d128e",
        _flags("fp16", 128, True, 3, 3000, 24, 8),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d64-fp16-full-b4-h10-n2304",
        "sm90_sweep_d64e",
        _flags("fp16", 64, False, 4, 2304, 10),
        held_out=True,
        gpu="h100",
    ),
    # sweeps 63-68, held out: planned 2026-12-07 (session 40) after 57-62 were scored and before any further change
    # to the search was designed, and measured on an H100 at once; at the classes that miss with 17 in flight (d256
    # non-causal: 39, 46 and 50's; d128 causal GQA: 7's; d64 few units: 52 and 57's) at other shapes, d128 mid N and
    # d256 causal. Sealed until they judged the pattern move's coupled steps (session 43), scored once then
    Sweep(
        "d256-bf16-full-b6-h16-n1536",
        "sm90_sweep_d256f",
        _flags("bf16", 256, False, 6, 1536, 16),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d256-fp16-full-gqa32x8-b1-n6144",
        "sm90_sweep_d256f",
        _flags("fp16", 256, False, 1, 6144, 32, 8),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d128-bf16-causal-gqa32x8-b8-n1536",
        "sm90_sweep_d128e",
        _flags("bf16", 128, True, 8, 1536, 32, 8),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d64-fp16-full-b1-h16-n6144",
        "sm90_sweep_d64e",
        _flags("fp16", 64, False, 1, 6144, 16),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d128-fp16-full-b6-h16-n2048",
        "sm90_sweep_d128e",
        _flags("fp16", 128, False, 6, 2048, 16),
        held_out=True,
        gpu="h100",
    ),
    Sweep(
        "d256-bf16-causal-b2-h16-n3072",
        "sm90_sweep_d256f",
        _flags("bf16", 256, True, 2, 3072, 16),
        held_out=True,
        gpu="h100",
    ),
)
#: sweeps measured and stored, and not scored yet: no test and no `python -m tests.search.score` replays them until a
#: finished change to the search is judged on them (`score --sealed`); then, with that scoring in tests/data/README.md,
#: they move into SWEEPS. So a change designed after they were measured is still judged on landscapes nobody looked at
SEALED: tuple[Sweep, ...] = ()
#: sweeps planned and not measured yet (tests/data/README.md): `--only NAME` measures one; none is replayed until its
#: database is stored and the sweep moved into SWEEPS (or SEALED)
PLANNED: tuple[Sweep, ...] = ()
BY_NAME = {s.name: s for s in SWEEPS + SEALED + PLANNED}


def card_tag(name: str) -> str | None:
    """The database prefix of a card from its name as nvidia-smi prints it ("NVIDIA H100 80GB HBM3" -> "h100"),
    or None for a card this script has no prefix for."""
    return next((tag for tag in ("h100", "h200") if tag in name.lower()), None)


def on_card(sweep: Sweep, tag: str | None) -> Sweep:
    """The sweep as measured on the card ``tag``: a planned sweep takes the card's prefix (the database says where it
    ran); a stored one must resume on its own card, or its table would mix two cards' timings."""
    if tag is None or tag == sweep.gpu:
        return sweep
    if sweep in PLANNED:
        return replace(sweep, gpu=tag)
    raise SystemExit(
        f"{sweep.name} was measured on an {sweep.gpu.upper()} ({sweep.db}), and this card is an {tag.upper()}: "
        f"resume it on an {sweep.gpu.upper()}, or measure a new sweep (PLANNED) here"
    )


def _card(gpus: str) -> str | None:
    """The tag (:func:`card_tag`) of the first GPU of ``--gpus``, or None when nvidia-smi cannot tell."""
    index = gpus.split(",")[0]
    try:
        name = subprocess.run(
            ["nvidia-smi", "-i", index, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return card_tag(name)


def _stamp(t0: float) -> str:
    return f"[{time.strftime('%H:%M:%S')} +{time.monotonic() - t0:4.0f}s]"


def feasible_count(sweep: Sweep) -> int:
    """Statically feasible configs of the sweep's space at its problem on an H200 (the grid sampler's order)."""
    import itertools

    from tuner.devices import limits_for_arch
    from tuner.space import load_space

    space = load_space(sweep.space_file)
    device = limits_for_arch(90)  # H100/H200: 232,448 B opt-in shared memory, 132 SMs, as the H200 reports
    problem = sweep.problem()
    names = [k.name for k in space.knobs]
    configs = (dict(zip(names, v)) for v in itertools.product(*(k.values for k in space.knobs)))
    count = sum(space.check(c, problem, device) is None for c in configs)
    default = space.defaults(problem.head_dim)
    if space.check(default, problem, device) is not None:
        raise SystemExit(f"{sweep.name}: the default config is infeasible: {space.check(default, problem, device)}")
    return count


def estimate_s(sweep: Sweep, feasible: int) -> float:
    return START_UP_S + feasible / (sweep.rate or RATE[sweep.space])


def command(sweep: Sweep, out: Path, workers: int, gpus: str, timeout_s: float | None) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "tuner",
        "tune",
        "--family",
        sweep.space,
        "--sampler",
        "grid",
        "--trials",
        "100000",
        "--top-k",
        "0",
        "--compile-workers",
        str(workers),
        "--gpus",
        gpus,
        "--storage",
        f"sqlite:///{(out / sweep.db).resolve()}",
        "--study",
        sweep.study,
        *sweep.flags,
    ]
    if timeout_s is not None:
        cmd += ["--timeout", f"{timeout_s:.0f}"]
    return cmd


def summarize(db: Path, study_name: str) -> dict:
    """What the sweep's study holds: distinct configs measured (COMPLETE) and failed (checked or built but no
    timing: wrong result, compile or launch error), the best and the default TFLOPS."""
    import optuna
    from optuna.trial import TrialState

    try:  # the trial attributes flashtune writes (their names, should the module move)
        from tuner.study import DUPLICATE_OF, IS_DEFAULT, STATUS
    except ImportError:
        DUPLICATE_OF, IS_DEFAULT, STATUS = "duplicate_of", "is_default", "status"

    row = {"measured": 0, "failed": 0, "interrupted": 0, "best": None, "default": None}
    if not db.exists():
        return row
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.load_study(study_name=study_name, storage=f"sqlite:///{db.resolve()}")
    except KeyError:
        return row
    measured: dict[tuple, float] = {}
    failed: set[tuple] = set()
    for t in study.get_trials(deepcopy=False):
        if not t.params or DUPLICATE_OF in t.user_attrs:
            continue
        key = tuple(sorted(t.params.items()))
        if t.state == TrialState.COMPLETE and t.value is not None:
            measured.setdefault(key, t.value)
            if t.user_attrs.get(IS_DEFAULT):
                row["default"] = t.value
        elif t.state == TrialState.PRUNED and t.user_attrs.get(STATUS) != "infeasible":
            failed.add(key)
        elif t.state in (TrialState.FAIL, TrialState.RUNNING):
            row["interrupted"] += 1
    row["measured"], row["failed"] = len(measured), len(failed - set(measured))
    row["best"] = max(measured.values()) if measured else None
    return row


def run_sweep(sweep: Sweep, out: Path, workers: int, gpus: str, remaining_s: float, t0: float) -> tuple[int, float]:
    """Run (or resume) one sweep within ``remaining_s``; its output goes to DIR/measure_sweeps.log (one file for
    all sweeps: the device machine returns at most 8 files) and, line by line, here. Returns the exit status
    (130: interrupted at the budget) and the wall seconds."""
    timeout = max(10.0, remaining_s - STOP_MARGIN_S)
    cmd = command(sweep, out, workers, gpus, timeout)
    log = out / LOG
    print(f"{_stamp(t0)} {sweep.name}: {shlex.join(cmd[1:])}", flush=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    hard = start + remaining_s + INTERRUPT_AFTER_S
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {sweep.name}: {shlex.join(cmd)}\n")
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
        )

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                f.write(line)
                f.flush()
                text = line.rstrip().replace("\r", " ")
                if text:
                    print(f"{_stamp(t0)} {sweep.name}: {text[:240]}", flush=True)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        interrupted = False
        while proc.poll() is None:
            now = time.monotonic()
            if not interrupted and now >= hard:
                print(f"{_stamp(t0)} {sweep.name}: past the budget, interrupting (Ctrl-C; rerun to resume)", flush=True)
                proc.send_signal(signal.SIGINT)
                interrupted = True
            elif interrupted and now >= hard + KILL_AFTER_S - INTERRUPT_AFTER_S:
                print(f"{_stamp(t0)} {sweep.name}: still running, killing its process group", flush=True)
                os.killpg(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.5)
        rc = proc.wait()
        reader.join(timeout=10)
    return (130 if interrupted else rc), time.monotonic() - start


class InstalledSpaces:
    """The sweeps' space files copied into search_spaces/ (where ``--family NAME`` and the study's later
    reads look), and removed again on leaving; an identical file already there stays, a different one is refused."""

    def __init__(self, stems: list[str]) -> None:
        from tuner.paths import SEARCH_SPACES

        self.pairs = [(SPACES / f"{s}.toml", SEARCH_SPACES / f"{s}.toml") for s in dict.fromkeys(stems)]
        self.copied: list[Path] = []

    def check(self) -> None:
        for src, dst in self.pairs:
            if dst.exists() and dst.read_bytes() != src.read_bytes():
                raise SystemExit(f"{dst} exists and differs from {src}: remove it or make it the same file")

    def __enter__(self) -> Self:
        self.check()
        for src, dst in self.pairs:
            if not dst.exists():
                shutil.copyfile(src, dst)
                self.copied.append(dst)
        return self

    def __exit__(self, *exc) -> None:
        for dst in self.copied:
            dst.unlink(missing_ok=True)


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[dict]) -> None:
    print(
        f"{'sweep':<33} {'held-out':>8} {'feasible':>8} {'measured':>8} {'failed':>6} {'best TFLOPS':>11} "
        f"{'default TFLOPS':>14} {'default/best':>12} {'wall s':>7}  status"
    )
    for r in rows:
        ratio = r["default"] / r["best"] if r.get("default") and r.get("best") else None
        print(
            f"{r['sweep']:<33} {'yes' if r['held_out'] else '':>8} {r['feasible']:>8} {r['measured']:>8} "
            f"{r['failed']:>6} {_fmt(r['best']):>11} {_fmt(r['default']):>14} {_fmt(ratio, '.3f'):>12} "
            f"{r['wall_s']:>7.0f}  {r['status']}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder of the sweeps' SQLite files and logs")
    parser.add_argument(
        "--budget",
        type=float,
        default=480.0,
        help="seconds for all sweeps together, from this script's start (default %(default)s)",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=list(BY_NAME),
        help="run only this sweep (repeatable; the only way to run a PLANNED one)",
    )
    parser.add_argument("--compile-workers", type=int, default=15)
    parser.add_argument("--gpus", default="0")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the commands, feasible counts and time estimate; run nothing (no GPU needed)",
    )
    args = parser.parse_args(argv)
    if args.budget <= 0:
        parser.error("--budget must be positive")
    t0 = time.monotonic()
    sweeps = [BY_NAME[n] for n in args.only] if args.only else list(SWEEPS)
    feasible = {s.name: feasible_count(s) for s in sweeps}
    out = args.out
    if args.dry_run:
        total = COLD_CUPY_S
        for s in sweeps:
            est = estimate_s(s, feasible[s.name])
            total += est
            print(
                f"{s.name}{' (HELD-OUT)' if s.held_out else ''}: {s.space_file.relative_to(REPO)}, "
                f"{feasible[s.name]} feasible, ~{est:.0f} s"
            )
            print("    " + shlex.join(["flashtune", *command(s, out, args.compile_workers, args.gpus, None)[3:]]))
        print(
            f"estimated total: ~{total:.0f} s (with {COLD_CUPY_S:.0f} s for a new machine's CuPy kernels); "
            f"budget {args.budget:.0f} s"
        )
        InstalledSpaces([s.space for s in sweeps]).check()
        return 0

    tag = _card(args.gpus)
    sweeps = [on_card(s, tag) for s in sweeps]
    out.mkdir(parents=True, exist_ok=True)
    deadline = t0 + args.budget
    summary_path = out / "measure_sweeps.json"
    previous = {}
    if summary_path.exists():
        try:
            previous = {r["sweep"]: r for r in json.loads(summary_path.read_text())}
        except (ValueError, KeyError, TypeError):
            previous = {}
    rows = []
    exit_code = 0
    with InstalledSpaces([s.space for s in sweeps]):
        for i, s in enumerate(sweeps, 1):
            row = {
                "sweep": s.name,
                "held_out": s.held_out,
                "space": str(s.space_file.relative_to(REPO)),
                "flags": list(s.flags),
                "db": s.db,
                "study": s.study,
                "feasible": feasible[s.name],
                "wall_s": 0.0,
            }
            before = summarize(out / s.db, s.study)
            remaining = deadline - time.monotonic()
            if before["measured"] + before["failed"] >= feasible[s.name]:
                row["status"] = "already complete"
                print(
                    f"{_stamp(t0)} [{i}/{len(sweeps)}] {s.name}: already complete in {out / s.db}, skipped", flush=True
                )
            elif remaining < MIN_START_S:
                row["status"] = "skipped: budget spent (rerun to measure it)"
                print(
                    f"{_stamp(t0)} [{i}/{len(sweeps)}] {s.name}: SKIPPED, {max(0, remaining):.0f} s of the budget "
                    f"left (a sweep starts with at least {MIN_START_S:.0f} s); rerun the same command to measure it",
                    flush=True,
                )
            else:
                print(
                    f"{_stamp(t0)} [{i}/{len(sweeps)}] {s.name}{' (held-out)' if s.held_out else ''}: "
                    f"{feasible[s.name]} feasible, {before['measured'] + before['failed']} already stored, "
                    f"~{estimate_s(s, feasible[s.name] - before['measured'] - before['failed']):.0f} s estimated, "
                    f"{remaining:.0f} s of the budget left",
                    flush=True,
                )
                rc, wall = run_sweep(s, out, args.compile_workers, args.gpus, remaining, t0)
                row["wall_s"], row["exit"] = round(wall, 1), rc
                after = summarize(out / s.db, s.study)
                done = after["measured"] + after["failed"] >= feasible[s.name]
                if rc in (0, 130):  # 130: interrupted at the budget (Ctrl-C, or killed): resumable
                    row["status"] = "complete" if done else "partial (rerun to resume)"
                else:
                    row["status"] = f"FAILED (exit {rc}, {'complete' if done else 'incomplete'}): see {LOG}"
                    exit_code = 1
                print(
                    f"{_stamp(t0)} [{i}/{len(sweeps)}] {s.name}: {row['status']}, {after['measured']} measured, "
                    f"{after['failed']} failed, best {_fmt(after['best'])} TFLOPS, {wall:.0f} s",
                    flush=True,
                )
            row.update(summarize(out / s.db, s.study))
            row["wall_s_all_runs"] = round(previous.get(s.name, {}).get("wall_s_all_runs", 0.0) + row["wall_s"], 1)
            rows.append(row)
    merged = {**previous, **{r["sweep"]: r for r in rows}}
    summary_path.write_text(json.dumps(list(merged.values()), indent=1))
    print(f"{_stamp(t0)} done; summary in {summary_path}")
    table(rows)
    if any(not r["status"].endswith("complete") for r in rows):
        print("not all sweeps are complete: rerun the same command to resume them")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
