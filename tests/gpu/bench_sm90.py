"""Benchmark and profile the sm90 kernel where cuDNN still wins (issue 10): N <= 2048, head dim 64,
short causal. A device script, not a pytest module. From the repo root, on the H200:

    python -m tests.gpu.bench_sm90 --out $OUT            # about 4 minutes (must stay under 6)
    python -m tests.gpu.bench_sm90 --out $OUT --quick    # smoke run: 2 shapes, few configs
    python -m tests.gpu.bench_sm90 --out $OUT --no-ncu --suite FILE --variants none --baseline DIR
                                                          # a kernel change: each default against DIR's build

Stages, each one robust (a failing config, backend or ncu run is reported and skipped):
1. plan: per shape, the default config and variants one knob (and the registers it needs) away,
   filtered by the space's static check;
2. compile every distinct (config, head dim, dtype, causal) in a process pool over all cores
   (tuner.compile, cubin cache under /tmp);
3. in a GPU worker process (tuner.worker: a hung or crashing kernel kills only the worker, which
   is restarted): per shape, random inputs and one float32 reference; each config checked once on
   poisoned outputs (a failure is WRONG and never timed); then ours, SDPA's CUDNN_ATTENTION and
   FLASH_ATTENTION on the same inputs, timed in 4 rounds, each launching the runners in turn, launch
   by launch in a shuffled order (launch_order; an L2 flush before every launch, CUDA events, no sync
   between launches; the result is the median of the rounds' medians); an 8192^3 cuBLAS GEMM once;
4. ncu (SpeedOfLight, LaunchStats, Occupancy, WarpStateStats and a tensor-pipe metric) on the
   default, the best variant and cuDNN at two shapes, one ncu run per shape: text under $OUT;
5. $OUT/bench_sm90.json with every timing, and a compact table printed last.

Needs only tuner modules that import without optuna/sqlalchemy (compile, space, problem, devices,
jobs, worker, gpu.*), CuPy and (for the peers) PyTorch.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import json
import math
import multiprocessing as mp
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("FLASHTUNE_CACHE_DIR", "/tmp/flashtune-bench-sm90")  # the cubin cache; workers inherit it

from tuner.devices import DeviceLimits
from tuner.gpu import TOLERANCES, CupyHandler
from tuner.problem import Problem
from tuner.space import ConfigError, Space, complete, config_key, load_space

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 340.0  # everything, including ncu, ends by then (the brief: under 6 minutes)
NCU_RESERVE_S = 100.0  # kept for the ncu stage while shapes are timed
TARGET_MS = 30.0  # GPU time per (runnable, round)
CHECK_TIMEOUT_S = 25.0  # loading and checking one config: a kernel still running by then hangs
ROUNDS = 4
TIMING_RESERVE_S = 8.0  # of --deadline kept per shape for its timing while kernels compile (~2-6 s are used)
_T0 = [time.perf_counter()]  # main() sets it again: --deadline counts from the run's start, not the import

# (dtype, head_dim, causal, batch, seqlen, heads): issue 10's table, then three more short shapes;
# the two that ncu profiles first, so that a short run still covers them
SHAPES = [
    ("fp16", 128, True, 32, 512, 16),
    ("fp16", 128, False, 8, 2048, 16),
    ("fp16", 128, True, 8, 2048, 16),
    ("fp16", 64, False, 4, 4096, 32),
    ("fp16", 128, True, 16, 1024, 16),
    ("fp16", 64, True, 8, 2048, 32),
    ("bf16", 128, False, 8, 2048, 16),
    ("fp16", 128, False, 2, 8192, 16),
    ("fp16", 128, True, 2, 8192, 16),
    ("bf16", 128, True, 1, 16384, 16),
]
QUICK_SHAPES = [SHAPES[0], SHAPES[3]]
NCU_SHAPES = [SHAPES[0], SHAPES[1]]  # default, best variant and cuDNN profiled here
PEERS = {"sdpa_cudnn": "CUDNN_ATTENTION", "sdpa_flash": "FLASH_ATTENTION"}
NCU_SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "WarpStateStats")
# tensor-pipe metrics, the first ones this ncu knows are added (Hopper's wgmma pipe is "gmma")
TENSOR_METRIC_BASES = (
    "sm__pipe_tensor_op_gmma_cycles_active",
    "sm__inst_executed_pipe_tensor_op_gmma",
    "sm__pipe_tensor_op_hmma_cycles_active",
    "sm__pipe_tensor_cycles_active",
)
ABBREV = {
    "kv_stages": "kvs",
    "kv_barriers": "kvb",
    "block_n": "bn",
    "consumer_wgs": "wgs",
    "rescale_slack": "slack",
    "producer_regs": "preg",
    "consumer_regs": "creg",
    "intra_wg_overlap": "ovl",
    "pingpong": "pp",
    "pv_split": "pvs",
    "poly_exp": "poly",
    "cta_mode": "cta",
    "persistent": "pers",
    "ctas_per_sm": "ctas",
    "kv_splits": "splits",
    "tail_splits": "tail",
}


def log(message: str) -> None:
    print(f"[{time.perf_counter() - _T0[0]:6.1f}s] {message}", flush=True)


def time_left() -> float:
    return _DEADLINE[0] - (time.perf_counter() - _T0[0])


_DEADLINE = [DEADLINE_S]  # --deadline replaces it
_NCU_RESERVE = [NCU_RESERVE_S]  # --no-ncu makes it 0: no time kept for a stage that does not run


def make_problem(shape: tuple) -> Problem:
    dtype, head_dim, causal, batch, seqlen, heads = shape
    return Problem(batch=batch, seqlen_q=seqlen, heads_q=heads, head_dim=head_dim, dtype=dtype, causal=causal)


# ---- 1. plan -----------------------------------------------------------------------------------
def variants(head_dim: int, quick: bool) -> dict[str, dict[str, int]]:
    """Named partial configs: the default, and what one knob away may pay at short N (with the
    register budgets that knob needs). The other knobs are completed for each shape (tuner.space.complete): a
    cluster or one CTA per block takes the static scheduler, the one default moved here (an order, not another
    variant); a variant that runs only with other defaults moved is dropped, as one that cannot run at all."""
    cta2 = {"cta_mode": 2, "producer_regs": 32, "consumer_regs": 232}
    two_wgs = {"consumer_wgs": 2, "producer_regs": 24, "consumer_regs": 240}  # the d128 default's (d64: 3 warpgroups)
    wgs3 = {"consumer_wgs": 3, "producer_regs": 32, "consumer_regs": 160, "block_n": 128 if head_dim == 64 else 80}
    fa3_d64 = {**wgs3, "kv_stages": 2}  # FA3's d64 tiles: two K/V stages (the d64 default's three leave no room for P)
    ctas2 = {
        "ctas_per_sm": 2,
        "consumer_wgs": 1,
        "producer_regs": 24,
        "consumer_regs": 232,
        "block_n": 128 if head_dim == 64 else 64,
    }
    if quick:
        return {
            "default": {},
            "one_per_block": {"persistent": 0},
            "ctas2": {"persistent": 0, **ctas2},
            "pingpong": {"persistent": 0, "pingpong": 1, **two_wgs},
        }
    v: dict[str, dict[str, int]] = {
        "default": {},
        "one_per_block": {"persistent": 0},  # the default is persistent at d64 and d128, not at d256
        "persistent": {"persistent": 1},
        "cta2": cta2,
        "persistent_cta2": {"persistent": 1, **cta2},
        "pingpong": {"pingpong": 1},
        "persistent_pingpong": {"persistent": 1, "pingpong": 1},
        "kv3": {"kv_stages": 3},
        "persistent_kv3": {"persistent": 1, "kv_stages": 3},
        **{f"bn{n}": {"block_n": n} for n in (64, 96, 176, 192)},
        "wgs3": wgs3,
        "persistent_wgs3": {"persistent": 1, **wgs3},
        "wgs1": {"consumer_wgs": 1, "producer_regs": 56, "consumer_regs": 256, "block_n": 176},
        "serial_pv64": {"intra_wg_overlap": 0, "pv_split": 64},
        "ctas2": ctas2,
        "ctas2_persistent": {"persistent": 1, **ctas2},
        "ctas2_kv1": {"kv_barriers": 1, **ctas2},
    }
    v.update(
        {  # knobs of issue 18 (an older tree without them reports them as invalid)
            "dynamic": {"persistent": 1, "scheduler": 1},
            "dynamic_kv3": {"persistent": 1, "scheduler": 1, "kv_stages": 3},
            "dynamic_bn176": {"persistent": 1, "scheduler": 1, "block_n": 176},
            "dynamic_bn192": {"persistent": 1, "scheduler": 1, "block_n": 192},
            "one_per_block_bn192": {"block_n": 192},
            "wgs2": {"persistent": 1, **two_wgs},
            "wgs2_dynamic": {"persistent": 1, "scheduler": 1, **two_wgs},
            "wgs2_bn176": {"persistent": 1, **two_wgs, "block_n": 176},
            "wgs2_bn192": {"persistent": 1, **two_wgs, "block_n": 192},
            "wgs2_one_per_block": two_wgs,
            "one_per_block_bn176": {"block_n": 176},
            # P in shared memory (wgmma ss for O += P.V): 2 consumer warpgroups, the overlapped loop
            "p_smem_wgs2": {"persistent": 1, **two_wgs, "p_smem": 1},
        }
    )
    if head_dim == 64:
        v.update(
            {
                "poly2": {"poly_exp": 2},
                "poly4": {"poly_exp": 4},
                "wgs3_poly2": {"poly_exp": 2, **wgs3},
                "wgs3_serial_bn160": {**wgs3, "block_n": 160, "intra_wg_overlap": 0},
                "wgs3_serial_bn160_poly2": {**wgs3, "block_n": 160, "intra_wg_overlap": 0, "poly_exp": 2},
                "ctas2_poly2": {"poly_exp": 2, **ctas2},
                "ctas2_bn192": {**ctas2, "block_n": 192},
                # FA3's d64 tile: 192 x 192, 3 warpgroups of 160 registers, P in shared memory, serial loop; the
                # same with the overlapped loop at its widest spill-free block_n (144)
                "p_smem": {**fa3_d64, "block_n": 192, "intra_wg_overlap": 0, "p_smem": 1},
                "p_smem_bn144": {**fa3_d64, "block_n": 144, "p_smem": 1},
                "p_smem_serial_bn160": {
                    **fa3_d64,
                    "block_n": 160,
                    "intra_wg_overlap": 0,
                    "p_smem": 1,
                },  # beside wgs3_serial_bn160
                # the same persistent, as the default is (the variants not named persistent run one CTA per block)
                "p_smem_persistent": {**fa3_d64, "block_n": 192, "intra_wg_overlap": 0, "p_smem": 1, "persistent": 1},
                "p_smem_bn144_persistent": {**fa3_d64, "block_n": 144, "p_smem": 1, "persistent": 1},
                "wgs3_serial_bn160_persistent": {**wgs3, "block_n": 160, "intra_wg_overlap": 0, "persistent": 1},
                "p_smem_serial_bn160_persistent": {
                    **fa3_d64,
                    "block_n": 160,
                    "intra_wg_overlap": 0,
                    "p_smem": 1,
                    "persistent": 1,
                },
            }
        )
    else:
        v["ctas2_bn80"] = {**ctas2, "block_n": 80}
        v["fa3_d128"] = {"persistent": 1, "q_stages": 1, "block_n": 176}  # FA3's d128 tile, persistent: one Q stage
        v["fa3_d128_dynamic"] = {"persistent": 1, "q_stages": 1, "block_n": 176, "scheduler": 1}
    # split-KV: the default with kv_splits (persistent and dynamic at d64 and d128, one CTA per block at d256)
    for splits in (2, 3, 4, 6, 8):
        v[f"split{splits}"] = {"kv_splits": splits, **({} if head_dim == 256 else {"persistent": 1, "scheduler": 1})}
    # the tail split: the default with tail_splits (persistent and dynamic; at d256 with one Q stage, whose
    # persistent default without a split is tail1: elsewhere tail1 is the default and dropped as a duplicate)
    for splits in (1, 2, 3, 4):
        v[f"tail{splits}"] = {
            "tail_splits": splits,
            "persistent": 1,
            "scheduler": 1,
            **({"q_stages": 1} if head_dim == 256 else {}),
        }
    v["q1"] = {"persistent": 1, "q_stages": 1}  # the default tile with one Q stage
    if head_dim == 256:  # a re-timed winner at d256 bf16 causal B4 H8 N2048, 1.18x (tests/gpu/d256_causal_shapes.toml)
        v["q1_bn64"] = {"persistent": 1, "q_stages": 1, "block_n": 64, "scheduler": 0}
        v["q1_bn64_win"] = {**v["q1_bn64"], "consumer_regs": 232, "rescale_slack": 6}  # that winner whole
        v["q1_bn64_dynamic"] = {**v["q1_bn64"], "scheduler": 1}  # units longest first from a tile counter
        # the same in sections of heads, longest query block first across a section (unit_order=1; causal only), and
        # with only the last heads in such a section (unit_order=2)
        v["q1_bn64_dynamic_sections"] = {**v["q1_bn64_dynamic"], "unit_order": 1}
        v["q1_bn64_dynamic_last"] = {**v["q1_bn64_dynamic"], "unit_order": 2}
    v["q1_dynamic"] = {"persistent": 1, "q_stages": 1, "scheduler": 1}
    # every variant not named persistent is one CTA per block (the default's persistent is 1 at d64 and d128)
    v = {
        name: partial if name == "default" or "persistent" in partial else {"persistent": 0, **partial}
        for name, partial in v.items()
    }
    return v


def plan_shape(space: Space, device: DeviceLimits, problem: Problem, quick: bool) -> tuple[list[dict], list[dict]]:
    """(runnable configs, skipped ones with the reason), distinct configs only, the default first."""
    chosen, skipped, seen = [], [], set()
    defaults = space.defaults(problem.head_dim)
    for name, partial in variants(problem.head_dim, quick).items():
        if _ONLY and name not in _ONLY and name != "default":
            continue
        try:
            space.validate(partial, partial=True)
        except ValueError as e:
            skipped.append({"name": name, "status": "invalid", "detail": str(e)})
            continue
        try:
            completion = complete(space, partial, problem, device)
        except ConfigError as e:
            skipped.append({"name": name, "status": "infeasible", "detail": str(e)})
            continue
        if {knob for knob, _, _ in completion.moved} - {"scheduler"}:  # another variant than the one named
            skipped.append({"name": name, "status": "infeasible", "detail": completion.note})
            continue
        config = completion.config
        key = config_key(config)
        if key in seen:
            continue
        seen.add(key)
        chosen.append({"name": name, "config": config, "diff": {k: v for k, v in config.items() if defaults[k] != v}})
    # the problem's default (the space's [[defaults]] rules on top of the head dim's), where it differs: what a
    # study starts from and tuner.attention runs with config=None
    config = space.defaults(problem=problem, device=device)
    same = next((e for e in chosen if config_key(e["config"]) == config_key(config)), None)
    if same is not None:
        same["rules"] = True
    else:
        diff = {k: v for k, v in config.items() if defaults[k] != v}
        chosen.insert(1, {"name": "rules", "config": config, "diff": diff, "rules": True})
    rules_variants = {} if quick else RULES_VARIANTS | (RULES_VARIANTS_D256 if problem.head_dim == 256 else {})
    for name, knobs in rules_variants.items():  # a few knobs away from the problem's default (None: the head dim's)
        if _ONLY and name not in _ONLY:
            continue
        moved = {**config, **{k: defaults[k] if v is None else v for k, v in knobs.items()}}
        reason = space.check(moved, problem, device)
        if reason is not None:
            skipped.append({"name": name, "status": "infeasible", "detail": reason})
        elif config_key(moved) not in seen and moved != config:
            seen.add(config_key(moved))
            chosen.append({"name": name, "config": moved, "diff": {k: v for k, v in moved.items() if defaults[k] != v}})
    if not quick and (not _ONLY or SERVED in _ONLY):
        served = _served(space, problem, device)
        if config_key(served) not in seen and served != config:  # the shipped table's winner, not the default
            seen.add(config_key(served))
            chosen.append(
                {"name": SERVED, "config": served, "diff": {k: v for k, v in served.items() if defaults[k] != v}}
            )
    if _BASELINE:  # the problem's default again, built from the kernel sources under --baseline
        diff = {k: v for k, v in config.items() if defaults[k] != v}
        chosen.append({"name": "baseline", "config": config, "diff": diff, "root": _BASELINE[0]})
    return chosen, skipped


# knobs set on top of the problem's default (the [[defaults]] rules applied), not the head dim's as in variants():
# what a rule's choice is worth beside another knob's default (dropped where it is the problem's default already)
RULES_VARIANTS = {
    "rules_kv2": {"kv_stages": 2},  # the d64 default has three
    "rules_exp_after": {"intra_wg_overlap": 1},  # a block's exponentials after the previous block's P.V wait
    "rules_exp_beside": {"intra_wg_overlap": 2},  # a block's exponentials beside that P.V
    "rules_sections": {"unit_order": 1},  # causal units in sections of heads, longest first across a section
    "rules_last": {"unit_order": 2},  # the same for the last heads only, one after another before them
    "rules_heads": {"unit_order": 0},  # causal units one head after another, where a rule chose another order
    # three K/V stages with ping-pong (the best of sweep 45, d128 bf16 non-causal B1 H32 N16384 on an H100, 1.10x the
    # default there), on persistent CTAs with one Q stage (two do not fit beside three stages) and one CTA per block
    "rules_kv3_pp_q1": {"kv_stages": 3, "pingpong": 1, "q_stages": 1},
    "rules_kv3_pp_one": {"kv_stages": 3, "pingpong": 1, "persistent": 0, "scheduler": 0},
    # d64 with few units: 2 consumer warpgroups with 192-key blocks, no tail split (the best of held-out sweep 52, d64
    # fp16 non-causal B2 H10 N4096 on an H100, whose space held tail_splits at 1), and the same with the tail split
    "rules_wgs2_192": {"consumer_wgs": 2, "producer_regs": 24, "consumer_regs": 240, "block_n": 192, "tail_splits": 1},
    "rules_wgs2_192_tail": {"consumer_wgs": 2, "producer_regs": 24, "consumer_regs": 240, "block_n": 192},
    "rules_no_tail": {"tail_splits": 1},
    # d64 non-causal: 96-key blocks with ping-pong (3 consumer warpgroups), the best of held-out sweeps 57 and 62 (d64
    # B1 H12 N8192 and B4 H10 N2304 on an H100, 1.018x and 1.012x their default), and with the static scheduler and a
    # 24-register producer budget as in 57
    "rules_bn96_pp": {"block_n": 96, "pingpong": 1},
    "rules_bn96_pp_static": {"block_n": 96, "pingpong": 1, "scheduler": 0, "producer_regs": 24},
    "rules_bn128": {"block_n": 128, "pingpong": 0},  # where the d64 ping-pong rule fired: the default without it
    # the winners of 24-trial studies on an H100 (BENCHMARKS.md, session 44): causal d64 at N 2048-8192, one barrier
    # per K/V stage with units in sections (and four K/V stages at N >= 4096), 1.035-1.071x the default; causal d128 at
    # N 2048-3000, ping-pong, 1.033-1.065x
    "rules_kvb1": {"kv_barriers": 1},
    "rules_kvb1_sections": {"kv_barriers": 1, "unit_order": 1},
    "rules_kvb1_sections_kv4": {"kv_barriers": 1, "unit_order": 1, "kv_stages": 4},
    "rules_pp": {"pingpong": 1},
    # where the rules written from them fire (session 45): each knob back to the head dim's value
    "rules_kvb2": {"kv_barriers": 2},
    "rules_no_pp": {"pingpong": 0},
}
# d256 only: session 33's tile (persistent CTAs, one Q stage, 64-key blocks) with the dynamic scheduler, on top of the
# problem's default (its unit order and split rules kept), and beside it one knob more
_D256_TILE = {"persistent": 1, "q_stages": 1, "block_n": 64, "scheduler": 1}
RULES_VARIANTS_D256 = {
    "rules_tile": _D256_TILE,
    "rules_tile_static": {**_D256_TILE, "scheduler": 0},
    "rules_tile_r232": {**_D256_TILE, "consumer_regs": 232},
    "rules_tile_pp": {**_D256_TILE, "pingpong": 1},
    "rules_tile_last": {**_D256_TILE, "unit_order": 2},  # where no rule gave the last section
    # the head dim's own values of the tile's knobs (None: the head dim's default), where a d256 tile rule set them
    "rules_untiled": dict.fromkeys((*_D256_TILE, "pingpong")),
}
SERVED = "served_h200"  # the config the H200 table flashtune ships serves the problem (config="auto", no tuned=)


def _served(space: Space, problem: Problem, device: DeviceLimits) -> dict:
    """The config ``tuner.attention(config="auto")`` runs ``problem`` with on an H200 (the shipped table's entry for
    its bucket, made to serve its batch and heads), checked against this ``device``'s limits."""
    from tuner.serve import shipped_tuned

    return shipped_tuned("NVIDIA H200").lookup(space, problem, device.arch, device)[0]


_NCU_SLUGS: set[str] = set()  # --ncu-shape: profile these shapes (slugs) instead of NCU_SHAPES
_NCU_SOURCE: list[bool] = []  # --ncu-source: also stall samples per SASS instruction
_ONLY: set[str] = set()  # --variants: the named variants only (the default always)
_BASELINE: list[str] = []  # --baseline: a kernel tree to build the problem's default from as well


def diff_text(diff: dict[str, int]) -> str:
    return " ".join(f"{ABBREV.get(k, k)}={v}" for k, v in diff.items()) or "(default)"


# ---- 2. compile ----------------------------------------------------------------------------------
def _compile_one(arg: tuple) -> dict:
    """In a pool process: build one config; a failure is returned, not raised."""
    config, problem_dict, device_dict, root = arg
    from tuner.compile import compile_config

    space = load_space("sm90")
    if root:  # --baseline: the same config built from another kernel tree
        space = dataclasses.replace(space, root=Path(root).resolve())
    try:
        kernel = compile_config(space, config, Problem.from_dict(problem_dict), DeviceLimits(**device_dict))
        return {
            "ok": True,
            "cubin": kernel.cubin_path,
            "entry": kernel.entry,
            "resources": kernel.resources.to_dict(),
            "compile_s": round(kernel.seconds, 2),
            "cached": kernel.cached,
        }
    except Exception as e:
        return {"ok": False, "detail": f"{type(e).__name__}: {str(e)[:400]}"}


def static_key(problem: Problem) -> tuple:
    return (problem.dtype, problem.head_dim, problem.causal)


def build_key(problem: Problem, entry: dict) -> tuple:
    return (static_key(problem), config_key(entry["config"]), entry.get("root"))


def compile_all(plans: list[dict], device: DeviceLimits, budget_s: float) -> None:
    """Fills entry["build"] of every planned config (one compile per distinct static problem and config)."""
    jobs: dict[tuple, tuple] = {}
    for plan in plans:
        for entry in plan["configs"]:
            jobs.setdefault(
                build_key(plan["problem"], entry),
                (entry["config"], plan["problem"].to_dict(), device.to_dict(), entry.get("root")),
            )
    workers = max(1, min(os.cpu_count() or 1, len(jobs)))
    log(f"compiling {len(jobs)} distinct configs on {workers} processes (cache {os.environ['FLASHTUNE_CACHE_DIR']})")
    builds: dict[tuple, dict] = {}
    pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
    try:
        futures = {pool.submit(_compile_one, arg): key for key, arg in jobs.items()}
        done, pending = cf.wait(futures, timeout=budget_s)
        for future in done:
            try:
                builds[futures[future]] = future.result()
            except Exception as e:
                builds[futures[future]] = {"ok": False, "detail": f"compile process failed: {e}"}
        for future in pending:
            future.cancel()
            builds[futures[future]] = {"ok": False, "detail": f"compile not finished within {budget_s:.0f} s"}
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    failed = 0
    for plan in plans:
        for entry in plan["configs"]:
            entry["build"] = builds[build_key(plan["problem"], entry)]
            failed += not entry["build"]["ok"]
    spills = sum(
        1
        for p in plans
        for e in p["configs"]
        if e["build"].get("ok")
        and (e["build"]["resources"]["spill_store_bytes"] or e["build"]["resources"]["spill_load_bytes"])
    )
    log(f"compiled: {len(jobs)} distinct, {failed} failed (counted per shape), {spills} spilling (per shape)")


# ---- 3. GPU worker side (runs in the tuner.run.Worker child; state kept between calls) ---------------
_G: dict = {}


def device_info() -> dict:
    from tuner.gpu import gpu_info

    info = gpu_info()
    try:
        import torch

        info["torch"] = torch.__version__
        info["cudnn"] = torch.backends.cudnn.version()
        info["torch_cuda"] = torch.version.cuda
    except Exception as e:
        info["torch"] = f"unavailable: {e}"
    return info


def _reference(problem: Problem, q, k, v, scale: float, seed: int) -> dict:
    """fp32 O and LSE of the checked rows (tuner.gpu._inputs.check_rows), every (batch, head)."""
    import cupy
    import numpy as np

    from tuner.gpu._inputs import check_rows
    from tuner.gpu._reference import reference_problem

    p = problem
    rows = check_rows(p.batch, p.heads_q, p.seqlen_q, p.seqlen_k, np.random.default_rng(seed))
    ref_o, ref_lse = reference_problem(q, k, v, p, scale, rows=rows)
    return {
        "rows": None if rows is None else cupy.asarray(rows),
        "o": ref_o,
        "lse": ref_lse,
        "o_norm": cupy.sqrt((ref_o * ref_o).sum(axis=(1, 3))),
    }


def _check_o(o_f32) -> tuple[str | None, float]:
    """check_kernel's criteria for O (fp32 [B, N, H, D]): every element finite, the relative error
    of every (batch, head) within the dtype's tolerance. Returns (failure or None, worst error)."""
    import cupy

    p, ref = _G["problem"], _G["ref"]
    bad = int((~cupy.isfinite(o_f32)).sum())
    if bad:
        return f"{bad} of {o_f32.size} output elements are unwritten or not finite", math.inf
    diff = (o_f32 if ref["rows"] is None else o_f32[:, ref["rows"]]) - ref["o"]
    rel = float((cupy.sqrt((diff * diff).sum(axis=(1, 3))) / cupy.maximum(ref["o_norm"], 1e-30)).max())
    tol = TOLERANCES[p.dtype][0]
    return (None if rel <= tol else f"O relative error {rel:.3g} > {tol:g}"), rel


def _check_lse(lse) -> tuple[str | None, float]:
    """check_kernel's criteria for LSE: no NaN, not -inf on a row that sees keys, within tolerance."""
    import cupy

    p, ref = _G["problem"], _G["ref"]
    if int(cupy.isnan(lse).sum()):
        return "LSE values are unwritten or NaN", math.inf
    got = lse if ref["rows"] is None else lse[:, :, ref["rows"]]
    live = cupy.isfinite(ref["lse"])
    if bool((cupy.isneginf(got) & live).any()):
        return "LSE is -inf on a row that sees keys", math.inf
    err = float(cupy.where(live, cupy.abs(got - ref["lse"]), 0).max())
    tol = TOLERANCES[p.dtype][1]
    return (None if err <= tol else f"LSE error {err:.3g} > {tol:g}"), err


def setup_shape(arg: tuple) -> dict:
    """(problem dict, seed): inputs, outputs, the reference and the L2 flush buffer."""
    import cupy

    from tuner.gpu._tensors import random_inputs, storage_dtype

    problem_dict, seed = arg
    _G.clear()
    p = Problem.from_dict(problem_dict)
    start = time.perf_counter()
    q, k, v = random_inputs(p, seed)
    scale = 1.0 / math.sqrt(p.head_dim)
    _G.update(
        problem=p,
        q=q,
        k=k,
        v=v,
        scale=scale,
        runners={},
        o=cupy.empty(q.shape, dtype=storage_dtype(p.dtype)),
        lse=cupy.empty((p.batch, p.heads_q, p.seqlen_q), dtype=cupy.float32),
        flush=cupy.empty(64 * 1024 * 1024, dtype=cupy.int32),
    )  # 256 MB > the 60 MB L2
    _G["ref"] = _reference(p, q, k, v, scale, seed)
    cupy.cuda.Device().synchronize()
    rows = p.seqlen_q if _G["ref"]["rows"] is None else len(_G["ref"]["rows"])
    return {"reference_s": round(time.perf_counter() - start, 2), "rows_checked": rows}


def add_kernel(arg: dict) -> dict:
    """Load a cubin; with arg["check"], run it once on poisoned outputs against the reference.
    A passing (or unchecked) kernel becomes a runner for time_round."""
    import cupy

    from tuner.gpu._launch import load_kernel
    from tuner.gpu._tensors import poison, to_float32

    p = _G["problem"]
    kernel = load_kernel(
        arg["cubin"],
        arg["entry"],
        abi=arg["family_abi"],
        grid=tuple(arg["grid"]),
        threads=arg["threads"],
        smem_bytes=arg["smem_bytes"],
        config=arg["config"],
        abi_params=arg["abi"],
    )
    args = kernel.args(_G["q"], _G["k"], _G["v"], _G["o"], _G["lse"], _G["scale"])
    out: dict = {}
    try:
        out["ctas_per_sm_occupancy"] = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
            kernel.function.ptr, arg["threads"], arg["smem_bytes"]
        )
    except Exception as e:
        out["ctas_per_sm_occupancy"] = f"n/a ({type(e).__name__})"
    if arg.get("check", True):
        poison(_G["o"], p.dtype)
        poison(_G["lse"])
        kernel.launch(args)
        cupy.cuda.Device().synchronize()
        o_failure, rel = _check_o(to_float32(_G["o"], p.dtype))
        lse_failure, lse_err = _check_lse(_G["lse"])
        out.update(failure=o_failure or lse_failure, rel_error=rel, lse_error=lse_err)
        if out["failure"]:
            return out
    _G["runners"][arg["name"]] = lambda: kernel.launch(args)
    return out


def add_peers(_: object = None) -> dict:
    """SDPA backends on the same inputs (DLPack views, [B, N, H, D] storage seen as [B, H, N, D]),
    each run once and its O compared with the reference (SDPA returns no LSE here)."""
    out: dict = {}
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa
    except ImportError as e:
        return {name: {"failure": f"PyTorch unavailable: {e}"} for name in PEERS}
    import cupy

    p = _G["problem"]

    def as_torch(x):
        t = torch.from_dlpack(x)
        return (t.view(torch.bfloat16) if p.dtype == "bf16" else t).transpose(1, 2)

    q, k, v = (as_torch(x) for x in (_G["q"], _G["k"], _G["v"]))
    for name, backend in PEERS.items():

        def run(backend=backend):
            with sdpa_kernel(getattr(SDPBackend, backend)):
                return sdpa(q, k, v, is_causal=p.causal, scale=_G["scale"], enable_gqa=p.heads_q != p.heads_kv)

        try:
            result = run()
            torch.cuda.synchronize()
            failure, rel = _check_o(cupy.from_dlpack(result.transpose(1, 2).float().contiguous()))
            out[name] = {"failure": failure, "rel_error": rel}
            if not failure:
                _G["runners"][name] = run
        except Exception as e:
            out[name] = {"failure": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
    return out


def round_order(names: list[str], r: int) -> list[str]:
    """Round ``r``'s order of warm-up and first launches: ``names`` rotated by r // 2 places, reversed in odd
    rounds, so that no runner is always first or always behind the same one."""
    shift = (r // 2) % max(1, len(names))
    order = names[shift:] + names[:shift]
    return order[::-1] if r % 2 else order


def launch_order(names: list[str], i: int) -> list[str]:
    """The order of a round's ``i``-th launch of each runner: a permutation seeded by ``i`` (every run the same).
    A round times its runners launch by launch, interleaved, each behind a different one from launch to launch.
    Timed one after another instead (each runner's launches in a block, the blocks in a rotated and reversed
    order), two identical builds of the d128 default differed by up to 8% on an H100 at N 16384 (BENCHMARKS.md,
    session 42): a runner's block ran at the clocks its predecessor's power draw left, and the runner first in
    most rounds came out fastest."""
    order = list(names)
    random.Random(i).shuffle(order)
    return order


def time_round(names: list[str]) -> dict:
    """Each runner warmed and its launch time estimated, in ``names`` order; then every runner launched
    ``reps`` times, interleaved (:func:`launch_order`), each launch after an L2 flush and bracketed by CUDA
    events on the null stream, synchronised once at the end. ``reps`` fills about TARGET_MS per runner. Median
    ms per runner."""
    import cupy

    flush = _G["flush"]
    runners = {name: _G["runners"][name] for name in names if name in _G["runners"]}
    estimates = []
    for run in runners.values():
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        run()
        start.record()
        run()
        end.record()
        end.synchronize()
        estimates.append(max(cupy.cuda.get_elapsed_time(start, end), 1e-3))
    if not runners:
        return {}
    reps = int(min(50, max(5, TARGET_MS / (max(estimates) + 0.1))))
    events: dict[str, list] = {name: [] for name in runners}
    for i in range(reps):
        for name in launch_order(list(runners), i):
            s, e = cupy.cuda.Event(), cupy.cuda.Event()
            flush.fill(i)
            s.record()
            runners[name]()
            e.record()
            events[name].append((s, e))
    e.synchronize()
    out = {}
    for name, pairs in events.items():
        times = sorted(cupy.cuda.get_elapsed_time(s, e) for s, e in pairs)
        out[name] = {"ms": statistics.median(times), "min_ms": times[0], "reps": reps}
    return out


def time_gemm(_: object = None) -> dict:
    """An 8192^3 fp16 cuBLAS GEMM on random data, 3 rounds like the attention runners."""
    import torch

    n = 8192
    gen = torch.Generator(device="cuda").manual_seed(1)
    a = torch.randn(n, n, device="cuda", dtype=torch.float16, generator=gen)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16, generator=gen)
    _G.setdefault("runners", {})["cublas_gemm_8192"] = lambda: torch.matmul(a, b)
    _G.setdefault("flush", None)
    if _G["flush"] is None:
        import cupy

        _G["flush"] = cupy.empty(64 * 1024 * 1024, dtype=cupy.int32)
    rounds = [time_round(["cublas_gemm_8192"])["cublas_gemm_8192"]["ms"] for _ in range(ROUNDS)]
    ms = statistics.median(rounds)
    return {"round_ms": rounds, "ms": ms, "tflops": 2 * n**3 / (ms * 1e-3) / 1e12}


class Sm90Bench(CupyHandler):
    """The GPU worker's handler here: tuner.gpu's (setup, is_fatal), the device's info with PyTorch's versions,
    and this benchmark's calls (the functions above; their state kept in ``_G`` between calls). The parent
    calls ``worker.call(HANDLER.add_kernel, arg)``: a test substitutes a subclass for HANDLER."""

    def device_info(self) -> dict:
        return device_info()

    def setup_shape(self, arg: tuple) -> dict:
        return setup_shape(arg)

    def add_kernel(self, arg: dict) -> dict:
        return add_kernel(arg)

    def add_peers(self) -> dict:
        return add_peers()

    def time_round(self, names: list[str]) -> dict:
        return time_round(names)

    def time_gemm(self) -> dict:
        return time_gemm()


HANDLER: type[Sm90Bench] = Sm90Bench  # the GPU worker's handler


# ---- 3. GPU stage, parent side -----------------------------------------------------------------
def kernel_arg(space: Space, device: DeviceLimits, problem: Problem, entry: dict, check: bool) -> dict:
    geom = space.launch(entry["config"], problem, device)
    return {
        "name": entry["name"],
        "cubin": entry["build"]["cubin"],
        "entry": entry["build"]["entry"],
        "grid": list(geom.grid),
        "threads": geom.threads,
        "smem_bytes": geom.smem_bytes,
        "abi": geom.abi,
        "family_abi": space.family.abi,
        "config": entry["config"],
        "check": check,
    }


def failure_kind(error: Exception) -> str:
    """hang (the call timed out), crash (the worker died or hit a CUDA error), or error."""
    from tuner.run import WorkerCrashed, WorkerTimeout

    if isinstance(error, WorkerTimeout):
        return "hang"
    if isinstance(error, WorkerCrashed) or "CUDA" in str(error):
        return "crash"
    return "error"


def run_shape(worker, space: Space, device: DeviceLimits, plan: dict, seed: int, hung: list[dict]) -> None:
    """Check, then time, every compiled config of the plan and the peers. `hung`: the knob
    differences of configs that hung or crashed so far (this shape or an earlier one): a config
    that contains one of them is not run again (each hang costs a timeout and a new worker)."""
    from tuner.run import WorkerError

    problem = plan["problem"]

    def set_up(passed: list[dict]) -> None:
        info = worker.call(HANDLER.setup_shape, (problem.to_dict(), seed), timeout_s=180)
        for ok in passed:
            worker.call(HANDLER.add_kernel, kernel_arg(space, device, problem, ok, False), timeout_s=CHECK_TIMEOUT_S)
        if not passed:
            log(f"  inputs and reference ready ({info['reference_s']} s, {info['rows_checked']} rows per head checked)")

    set_up([])
    passed: list[dict] = []
    for entry in plan["configs"]:
        if not entry["build"]["ok"]:
            entry.update(status="compile_error", detail=entry["build"]["detail"])
            continue
        bad = next((d for d in hung if d.items() <= entry["diff"].items()), None)
        if bad is not None:
            entry.update(status="skipped", detail=f"contains {diff_text(bad)}, which hung or crashed")
            continue
        if time_left() < _NCU_RESERVE[0]:
            entry.update(status="skipped", detail="out of time")
            continue
        try:
            result = worker.call(
                HANDLER.add_kernel, kernel_arg(space, device, problem, entry, True), timeout_s=CHECK_TIMEOUT_S
            )
        except WorkerError as e:  # the worker may be gone: set the shape up again
            entry.update(status=failure_kind(e), detail=str(e)[:300])
            log(f"  {entry['name']}: {entry['status'].upper()}: {entry['detail'][:150]}")
            if entry["status"] in ("hang", "crash") and entry["diff"]:  # (not the default: that skips all)
                hung.append(entry["diff"])
            set_up(passed)
            continue
        entry.update(result)
        entry["status"] = "wrong" if result.get("failure") else "ok"
        if result.get("failure"):
            entry["detail"] = result["failure"]
            log(f"  {entry['name']}: WRONG: {result['failure']}")
        else:
            passed.append(entry)
    try:
        plan["peers"] = worker.call(HANDLER.add_peers, timeout_s=120)
    except WorkerError as e:
        plan["peers"] = {name: {"failure": f"peers failed: {str(e)[:200]}"} for name in PEERS}
        set_up(passed)
    for name, peer in plan["peers"].items():
        if peer.get("failure"):
            log(f"  {name}: {peer['failure'][:150]}")
    names = [e["name"] for e in passed] + [n for n, peer in plan["peers"].items() if not peer.get("failure")]
    rounds: dict[str, list[float]] = {n: [] for n in names}
    for r in range(ROUNDS):
        order = round_order(names, r)
        try:
            got = worker.call(HANDLER.time_round, order, timeout_s=90)
        except WorkerError as e:
            log(f"  timing round {r} failed: {str(e)[:200]}")
            break
        for n, t in got.items():
            rounds[n].append(t["ms"])
    flops = problem.flops
    for n, times in rounds.items():
        target = next((e for e in plan["configs"] if e["name"] == n), None) or plan["peers"][n]
        target["round_ms"] = times
        if times:
            target["ms"] = statistics.median(times)
            target["tflops"] = flops / (target["ms"] * 1e-3) / 1e12


# ---- 4. ncu ------------------------------------------------------------------------------------
def ncu_subject_run(spec_path: str) -> None:
    """Runs under ncu: each subject warmed up, then launched once between cudaProfilerStart/Stop."""
    import cupy

    spec = json.loads(Path(spec_path).read_text())
    CupyHandler().setup(0)
    problem = Problem.from_dict(spec["problem"])
    from tuner.gpu._tensors import random_inputs, storage_dtype

    q, k, v = random_inputs(problem, 7)
    _G.update(
        problem=problem,
        q=q,
        k=k,
        v=v,
        scale=1.0 / math.sqrt(problem.head_dim),
        runners={},
        o=cupy.empty(q.shape, dtype=storage_dtype(problem.dtype)),
        lse=cupy.empty((problem.batch, problem.heads_q, problem.seqlen_q), dtype=cupy.float32),
    )
    for subject in spec["subjects"]:
        try:
            if subject["kind"] == "flashtune":
                add_kernel({**subject["arg"], "check": False, "name": subject["label"]})
            else:
                import torch
                from torch.nn.attention import SDPBackend, sdpa_kernel
                from torch.nn.functional import scaled_dot_product_attention as sdpa

                def as_torch(x):
                    t = torch.from_dlpack(x)
                    return (t.view(torch.bfloat16) if problem.dtype == "bf16" else t).transpose(1, 2)

                tq, tk, tv = (as_torch(x) for x in (q, k, v))
                backend = getattr(SDPBackend, subject["backend"])

                def run(tq=tq, tk=tk, tv=tv, backend=backend):
                    with sdpa_kernel(backend):
                        sdpa(tq, tk, tv, is_causal=problem.causal, scale=_G["scale"])

                _G["runners"][subject["label"]] = run
            run = _G["runners"][subject["label"]]
            run()
            run()
            cupy.cuda.Device().synchronize()
            print(f"NCU-SUBJECT {subject['label']}", flush=True)
            cupy.cuda.runtime.profilerStart()
            run()
            cupy.cuda.Device().synchronize()
            cupy.cuda.runtime.profilerStop()
        except Exception as e:
            print(f"NCU-SUBJECT-FAILED {subject['label']}: {type(e).__name__}: {e}", flush=True)


def tensor_metrics(ncu: str) -> list[str]:
    """The tensor-pipe metrics of TENSOR_METRIC_BASES that this ncu knows for the device."""
    try:
        listing = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    known = {line.split()[0] for line in listing.splitlines() if line.strip()}
    return [f"{base}.avg.pct_of_peak_sustained_active" for base in TENSOR_METRIC_BASES if base in known][:2]


def ncu_command(ncu: str, spec_path: str, metrics: list[str], launches: int, report: str | None = None) -> list[str]:
    """The ncu command line. With `report` (a path without suffix) it also samples warp stalls per SASS
    instruction (SourceCounters) and saves the report there, for ncu_source_table."""
    cmd = [
        ncu,
        "--clock-control",
        "none",
        "--target-processes",
        "all",
        "--profile-from-start",
        "off",
        "--launch-count",
        str(launches),
    ]
    for section in NCU_SECTIONS:
        cmd += ["--section", section]
    if report:
        cmd += ["--section", "SourceCounters", "--import-source", "no", "--export", report, "--force-overwrite"]
    if metrics:
        cmd += ["--metrics", ",".join(metrics)]
    return [*cmd, sys.executable, "-m", "tests.gpu.bench_sm90", "--ncu-run", spec_path]


KEY_LINE = re.compile(
    r"NCU-SUBJECT|==ERROR==|==WARNING==|flashtune_fwd|sdpa|fmha|fprop|cudnn|Duration|"
    r"Registers Per Thread|Dynamic Shared Memory Per Block|Grid Size|Block Size|Waves Per SM|"
    r"Achieved Occupancy|Theoretical Occupancy|Block Limit|Compute \(SM\) Throughput|"
    r"Memory Throughput|pipe_tensor|No Eligible|Issued Warp Per Scheduler|Warp Cycles Per Issued",
    re.IGNORECASE,
)


def ncu_source_table(ncu: str, report: str) -> str:
    """Per SASS instruction of each profiled kernel: its stall samples by reason (ncu's source page, CSV)."""
    cmd = [ncu, "--import", f"{report}.ncu-rep", "--page", "source", "--csv", "--print-source", "sass"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return f"# $ {' '.join(cmd)} (exit code {run.returncode})\n{run.stdout}\n{run.stderr}"


def key_lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if KEY_LINE.search(line)][:80]


def _text(data: bytes | str | None) -> str:
    """Output captured by a subprocess that timed out: bytes whatever text= said."""
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def run_ncu(plans: list[dict], out: Path, space: Space, device: DeviceLimits, quick: bool) -> list[dict]:
    ncu = shutil.which("ncu")
    if ncu is None:
        log("ncu: not found on PATH, skipped")
        return [{"status": "skipped", "detail": "ncu not on PATH"}]
    metrics = tensor_metrics(ncu)
    log(f"ncu: {ncu}; tensor metrics: {metrics or 'none known'}")
    records = []
    wanted = _NCU_SLUGS or {make_problem(s).slug() for s in NCU_SHAPES[: 1 if quick else 2]}
    targets = [p for p in plans if p["slug"] in wanted]
    for plan in targets:
        left = time_left()
        if left < 25:
            records.append({"shape": plan["slug"], "status": "skipped", "detail": "out of time"})
            continue
        ours = [e for e in plan["configs"] if e.get("status") == "ok" and e.get("tflops")]
        default = next((e for e in ours if e["name"] == "default"), None)
        best = max((e for e in ours if e["name"] != "default"), key=lambda e: e["tflops"], default=None)
        subjects = [
            {
                "label": f"flashtune:{e['name']}",
                "kind": "flashtune",
                "arg": kernel_arg(space, device, plan["problem"], e, False),
            }
            for e in (default, best)
            if e
        ]
        if not plan.get("peers", {}).get("sdpa_cudnn", {}).get("failure"):
            subjects.append({"label": "cudnn", "kind": "sdpa", "backend": PEERS["sdpa_cudnn"]})
        spec = out / f".ncu_spec_{plan['slug']}.json"
        spec.write_text(json.dumps({"problem": plan["problem"].to_dict(), "subjects": subjects}))
        report = str(out / f"ncu_{plan['slug']}") if _NCU_SOURCE else None
        cmd = ncu_command(ncu, str(spec), metrics, launches=3 * len(subjects), report=report)
        path = out / f"ncu_{plan['slug']}.txt"
        start = time.perf_counter()
        try:
            run = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=min(75.0, left - 10),
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO)},
            )
            text = (
                f"$ {' '.join(cmd)}\n# subjects, in launch order: {', '.join(s['label'] for s in subjects)}\n"
                f"# exit code {run.returncode}\n{run.stdout}\n{run.stderr}"
            )
            status = "ok" if run.returncode == 0 else f"exit {run.returncode}"
        except subprocess.TimeoutExpired as e:
            text = f"$ {' '.join(cmd)}\n# timed out\n{_text(e.stdout)}\n{_text(e.stderr)}"
            status = "timeout"
        except OSError as e:
            text, status = f"$ {' '.join(cmd)}\n# failed: {e}", "error"
        finally:
            spec.unlink(missing_ok=True)
        path.write_text(text[:7_000_000])
        if report and status == "ok":
            try:
                source = ncu_source_table(ncu, report)
            except (OSError, subprocess.SubprocessError) as e:
                source = f"# ncu source page failed: {type(e).__name__}: {e}"
            (out / f"ncu_{plan['slug']}_sass.csv").write_text(source[:15_000_000])
        seconds = round(time.perf_counter() - start, 1)
        log(f"ncu {plan['slug']}: {status} in {seconds} s -> {path.name}; key lines:")
        for line in key_lines(text):
            print("    " + line.strip()[:160])
        records.append(
            {
                "shape": plan["slug"],
                "file": path.name,
                "status": status,
                "seconds": seconds,
                "subjects": [s["label"] for s in subjects],
            }
        )
    return records


# ---- 5. report ---------------------------------------------------------------------------------
def table(plans: list[dict], gemm: dict | None, *, top: int | None = None) -> str:
    """One row per config and peer, fastest first; "[rules]" marks the problem's default (the space's
    [[defaults]] rules applied). With `top`: per shape only the default, the problem's default, the `top`
    fastest, every config that failed (wrong, hang, compile error) and the peers."""
    lines = [
        f"{'shape':<30} {'config':<44} {'TFLOPS':>7} {'xcuDNN':>7} {'xdef':>6} {'rel_err':>8} "
        f"{'regs':>4} {'occ':>3} status"
    ]
    for plan in plans:
        peers = plan.get("peers", {})
        cudnn = peers.get("sdpa_cudnn", {}).get("tflops")
        default = next((e.get("tflops") for e in plan["configs"] if e["name"] == "default"), None)
        rows = sorted(plan["configs"], key=lambda e: -(e.get("tflops") or 0))
        if top is not None:
            fastest = [e for e in rows if e.get("tflops")][:top]
            rows = [
                e
                for e in rows
                if e in fastest
                or e["name"] == "default"
                or e.get("rules")
                or e.get("root")
                or e.get("status") not in ("ok", None)
            ]
        for e in rows + [{"name": n, **peer} for n, peer in peers.items()]:
            tf = e.get("tflops")
            res = e.get("build", {}).get("resources", {})
            spill = "S" if res.get("spill_store_bytes") or res.get("spill_load_bytes") else ""
            occ = e.get("ctas_per_sm_occupancy", "")
            label = (diff_text(e["diff"]) if "diff" in e else e["name"]) + (" [rules]" if e.get("rules") else "")
            label += " [baseline]" if e.get("root") else ""
            status = e.get("status", "ok" if tf else (e.get("failure") or "")[:40])
            status = status.upper() if status in ("wrong", "hang", "crash") else status
            rel = e.get("rel_error")
            cells = (
                f"{tf:.0f}" if tf else "-",
                f"{tf / cudnn:.3f}" if tf and cudnn else "-",
                f"{tf / default:.3f}" if tf and default else "-",
                f"{rel:.1e}" if isinstance(rel, float) and math.isfinite(rel) else "-",
                f"{res.get('registers', '')}{spill}",
                str(occ) if isinstance(occ, int) else "",
            )
            lines.append(
                f"{plan['slug']:<30} {label[:44]:<44} {cells[0]:>7} {cells[1]:>7} {cells[2]:>6} "
                f"{cells[3]:>8} {cells[4]:>4} {cells[5]:>3} {status if status != 'ok' else ''}"
            )
        for s in plan.get("skipped", []):
            if s["status"] == "invalid":
                lines.append(f"{plan['slug']:<30} {s['name']:<44} invalid: {s['detail'][:80]}")
    if gemm and gemm.get("tflops"):
        lines.append(f"cuBLAS GEMM 8192^3 fp16: {gemm['tflops']:.0f} TFLOPS ({gemm['ms']:.3f} ms)")
    elif gemm:
        lines.append(f"cuBLAS GEMM 8192^3 fp16: {gemm.get('failure', 'not timed')[:100]}")
    return "\n".join(lines)


def to_json(plans: list[dict], **extra) -> str:
    def clean(e: dict) -> dict:
        return {k: v for k, v in e.items() if k not in ("arg",)}

    shapes = [
        {
            "slug": p["slug"],
            "problem": p["problem"].to_dict(),
            "flops": p["problem"].flops,
            "configs": [clean(e) for e in p["configs"]],
            "skipped": p.get("skipped", []),
            "peers": p.get("peers", {}),
            "setup": p.get("setup"),
        }
        for p in plans
    ]
    return json.dumps({"shapes": shapes, **extra}, indent=1, default=str)


def main(argv: list[str] | None = None) -> int:
    _T0[0] = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="folder for bench_sm90.json, the table and ncu text")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 shapes, few configs, 1 ncu run")
    parser.add_argument("--no-ncu", action="store_true", help="skip the ncu stage")
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--suite", help="the problems of this suite file instead of the built-in shapes")
    parser.add_argument("--variants", help="comma-separated variant names to time beside the default (default: all)")
    parser.add_argument("--deadline", type=float, default=DEADLINE_S, help=f"seconds for everything ({DEADLINE_S:.0f})")
    parser.add_argument("--ncu-shape", action="append", default=[], help="slug of a shape to profile (repeatable)")
    parser.add_argument(
        "--ncu-source",
        action="store_true",
        help="ncu also samples warp stalls per SASS instruction: ncu_<shape>_sass.csv (ncu's source page)",
    )
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        help="also time each shape's default built from the kernel sources under DIR (a kernel_src tree, e.g. "
        "of an earlier commit: git archive HEAD kernel_src | tar -x -C /tmp/base), as config 'baseline'",
    )
    parser.add_argument("--ncu-run", help=argparse.SUPPRESS)  # internal: the process ncu profiles
    args = parser.parse_args(argv)
    if args.ncu_run:
        ncu_subject_run(args.ncu_run)
        return 0
    if not args.out:
        parser.error("--out is required")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from tuner.run import Worker, WorkerError

    space = load_space("sm90")
    _DEADLINE[0] = args.deadline
    _NCU_RESERVE[0] = 0.0 if args.no_ncu else NCU_RESERVE_S
    _ONLY.update(n for n in (args.variants or "").split(",") if n)
    _NCU_SLUGS.update(args.ncu_shape)
    if args.ncu_source:
        _NCU_SOURCE.append(True)
    if args.baseline:
        if not (Path(args.baseline) / "sm90" / "flash_fwd.cu").is_file():
            parser.error(f"--baseline {args.baseline}: no sm90/flash_fwd.cu there; give a kernel_src directory")
        _BASELINE.append(str(Path(args.baseline).resolve()))
    if args.suite:
        from tuner.study import load_suite  # reads the suite file only (no storage is opened)

        problems = list(load_suite(args.suite).problems)
    else:
        problems = [make_problem(s) for s in (QUICK_SHAPES if args.quick else SHAPES)]
    plans = [{"shape": p.slug(), "problem": p, "slug": p.slug()} for p in problems]
    timing_s = TIMING_RESERVE_S * len(plans) + 40 + _NCU_RESERVE[0]
    if args.deadline < timing_s + 30:
        parser.error(
            f"--deadline {args.deadline:.0f} leaves no time to compile: timing {len(plans)} shapes is given about "
            f"{timing_s:.0f} s of it; give --deadline {timing_s + 120:.0f} or more (the run ends when done)"
        )
    gemm: dict | None = None
    info: dict = {}
    log(f"bench_sm90: {len(plans)} shapes, python {sys.version.split()[0]}, out {out}")
    with Worker(handler=HANDLER, device=0) as worker:
        try:
            info = worker.device_info(timeout_s=180)
        except WorkerError as e:
            log(f"GPU worker failed to start: {e}")
            return 1
        device = DeviceLimits.from_info(info)
        log(
            f"GPU {info.get('name')} sm_{info.get('arch')} x{info.get('num_sms')}, smem/SM {device.smem_per_sm}, "
            f"torch {info.get('torch')} cuDNN {info.get('cudnn')}, cupy {info.get('cupy')}, "
            f"driver {info.get('driver')}"
        )
        hung: list[dict] = []
        for plan in plans:
            plan["configs"], plan["skipped"] = plan_shape(space, device, plan["problem"], args.quick)
            log(
                f"plan {plan['slug']}: {len(plan['configs'])} configs; infeasible: "
                + ", ".join(s["name"] for s in plan["skipped"])
            )
        compile_all(plans, device, budget_s=min(170.0, time_left() - TIMING_RESERVE_S * len(plans) - 40))
        for i, plan in enumerate(plans):
            reserve = _NCU_RESERVE[0]
            if time_left() < reserve + 20:
                log(f"out of time: {plan['slug']} and the rest are not timed")
                plan["setup"] = "skipped: out of time"
                continue
            log(f"shape {i + 1}/{len(plans)} {plan['slug']}")
            try:
                run_shape(worker, space, device, plan, args.seed + i, hung)
                plan["setup"] = "ok"
            except WorkerError as e:
                plan["setup"] = f"failed: {str(e)[:300]}"
                log(f"  shape failed: {str(e)[:200]}")
            best = max((e for e in plan["configs"] if e.get("tflops")), key=lambda e: e["tflops"], default=None)
            cudnn = plan.get("peers", {}).get("sdpa_cudnn", {}).get("tflops")
            if best:
                log(f"  best {best['name']} {best['tflops']:.0f} TFLOPS; cuDNN {cudnn and round(cudnn)}")
        if time_left() > (0 if args.no_ncu else 60) + 15:
            try:
                gemm = worker.call(HANDLER.time_gemm, timeout_s=90)
                log(f"cuBLAS 8192^3 fp16 GEMM: {gemm['tflops']:.0f} TFLOPS")
            except WorkerError as e:
                gemm = {"failure": str(e)[:300]}
    json_path = out / "bench_sm90.json"
    json_path.write_text(to_json(plans, gpu=info, gemm=gemm, elapsed_s=time.perf_counter() - _T0[0]))
    ncu_records = [] if args.no_ncu else run_ncu(plans, out, space, DeviceLimits.from_info(info), args.quick)
    (out / "bench_sm90_table.txt").write_text(table(plans, gemm) + "\n")
    text = table(plans, gemm, top=6)
    json_path.write_text(to_json(plans, gpu=info, gemm=gemm, ncu=ncu_records, elapsed_s=time.perf_counter() - _T0[0]))
    log(
        f"wrote {json_path.name}, bench_sm90_table.txt (every config) and {len(ncu_records)} ncu records; "
        "per shape the default, the 6 fastest, failures and peers:"
    )
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
