"""The sm90 kernel's work distribution, checked exhaustively on the CPU: tile_scheduler.cuh and
block_info.cuh compiled as host code with each config's macros and run over every CTA of the
grid that search_spaces/sm90.toml computes. Every query block of every (batch, head) is computed
exactly once, the CTAs of a cluster visit the same key blocks, no key a row sees is skipped and
no block that skips the mask holds a masked key. Needs nvcc, not a GPU."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.kernels.sm90_configs import CLUSTER, ONE_WG
from tests.kernels.sm90_configs import SM90_D64_REPRESENTATIVE as D64
from tests.kernels.sm90_configs import SM90_D256_REPRESENTATIVE as D256
from tests.kernels.sm90_configs import SM90_REPRESENTATIVE as ANY
from tuner.devices import limits_for_arch
from tuner.paths import KERNEL_SRC
from tuner.problem import Problem
from tuner.space import complete, load_space

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")

CHECK = Path(__file__).parent / "sm90_schedule_check.cu"

# (head dim, scheduling knobs and tile shapes; the rest completed at that head dim): the built configs
# (tests/kernels/sm90_configs.py) whose work distribution differs, and the orders only this test compares
CONFIGS = {
    **{
        name: (128, ANY[name])
        for name in (
            "default",
            "persistent",
            "cluster",
            "cluster_persistent",
            "one_wg",
            "two_ctas_per_sm_persistent",
            "dynamic",
            "dynamic_two_ctas_per_sm",
        )
    },
    "one_per_block": (128, {"persistent": 0}),
    "static_snake": (128, {"persistent": 1, "scheduler": 0}),
    "three_wgs_bn64_cluster_persistent": (128, ANY["three_wgs_cluster"]),
    "two_ctas_per_sm_cluster_persistent": (128, {**ANY["two_ctas_per_sm_cluster_serial"], "persistent": 1}),
    "dynamic_d64": (64, ANY["dynamic"]),
    "d64_three_wgs_bn160_persistent": (64, D64["d64_three_wgs_serial_bn160_persistent"]),
    "d256_bn80_cluster": (256, D256["d256_cluster"]),  # 40-row halves
    "d256_one_wg_bn96": (256, {**ONE_WG, "block_n": 96}),
    "d256_one_wg_bn64_persistent": (256, D256["d256_one_wg_persistent"]),
    "dynamic_d256_one_wg_bn64": (256, D256["d256_one_wg_dynamic"]),
    # split-KV: kv_splits units per query block, each a contiguous range of its key blocks (with the dynamic and
    # the static order, one CTA per block, a cluster, and more splits than some blocks have key blocks)
    "split3_dynamic": (128, {"kv_splits": 3}),
    "split2_static_snake": (128, {"kv_splits": 2, "persistent": 1, "scheduler": 0}),
    "split4_one_per_block": (128, {"kv_splits": 4, "persistent": 0}),
    "split2_cluster": (128, {"kv_splits": 2, **CLUSTER}),
    "split8_d64": (64, {"kv_splits": 8}),
    "split6_d256": (256, {"kv_splits": 6}),
    # the tail split: the last wave's tiles split at run time (dynamic and static order, a cluster, 3 warpgroups,
    # two CTAs per SM, d256 persistent with one Q stage); run over many grids by test_the_tail_split_*
    **{name: (128, ANY[name]) for name in ("tail2", "tail3_static_snake", "tail2_cluster_persistent")},
    "tail4_two_ctas_per_sm": (128, ANY["tail4_two_ctas_per_sm"]),
    "tail3_d64": (64, {"tail_splits": 3}),
    "tail4_d256_one_q_stage": (256, D256["d256_persistent_one_q_stage_tail4"]),
    # unit_order > 0 (causal only): sections of heads, longest query block first across a section (1), or the last
    # heads alone in a section (2); with the dynamic order, one CTA per block, the static snake, a cluster, split-KV,
    # d64, and d256 persistent with one Q stage; test_sections_* runs them on shapes of several sections
    **{
        name: (128, {"unit_order": 1, **partial})
        for name, partial in {
            "sections_dynamic": {},
            "sections_one_per_block": {"persistent": 0},
            "sections_static_snake": {"persistent": 1, "scheduler": 0},
            "sections_cluster_persistent": {**CLUSTER, "persistent": 1},
            "sections_split3": {"kv_splits": 3},
            "last_section_dynamic": {"unit_order": 2},
            "last_section_one_per_block": {"unit_order": 2, "persistent": 0},
            "last_section_cluster_persistent": {**CLUSTER, "persistent": 1, "unit_order": 2},
        }.items()
    },
    "sections_d64": (64, {"unit_order": 1}),
    "sections_d256_q1_bn64": (256, {"unit_order": 1, "persistent": 1, "q_stages": 1, "block_n": 64, "scheduler": 0}),
}
TAIL = [name for name in CONFIGS if name.startswith("tail")]
CAUSAL_ONLY = {name for name, (_, partial) in CONFIGS.items() if partial.get("unit_order")}
BUILDS = [(name, causal) for name in CONFIGS for causal in (False, True) if causal or name not in CAUSAL_ONLY]

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv): tails, GQA, seqlen_q != seqlen_k both ways (causal rows
# that see no key; a causal offset of 1 and of 2 * 128 + 1 puts a warpgroup's last visible key alone in
# the next key block; seqlen_k one short of a whole key block of 64, 128 or 176), and more work units than
# an H200's 132 SMs (a persistent CTA loops)
SHAPES = [
    (1, 1, 1, 1, 1),
    (2, 17, 300, 3, 1),
    (1, 300, 17, 2, 2),
    (2, 1000, 1000, 8, 2),
    (3, 777, 1234, 4, 4),
    (4, 2048, 256, 16, 4),
    (1, 1500, 1500, 2, 1),
    (1, 300, 301, 2, 2),
    (2, 200, 457, 2, 1),
    (1, 200, 255, 2, 2),
    (1, 100, 351, 1, 1),
]


@pytest.fixture(scope="module")
def binaries(tmp_path_factory):
    space, device = load_space("sm90"), limits_for_arch(90)
    out = tmp_path_factory.mktemp("schedule")
    built = {}
    for name, (head_dim, partial) in CONFIGS.items():
        for causal in (False, True):
            if (name, causal) not in BUILDS:
                continue
            problem = Problem(batch=1, seqlen_q=128, heads_q=1, head_dim=head_dim, causal=causal)
            config = complete(space, partial, problem, device).config
            assert space.check(config, problem, device) is None, (name, space.check(config, problem, device))
            exe = out / f"{name}-{int(causal)}"
            flags = [f"-D{k}={v}" for k, v in space.macros(config, problem, device).items()]
            subprocess.run(
                ["nvcc", "-std=c++17", "-O1", "-x", "cu", "-I", str(KERNEL_SRC), *flags, str(CHECK), "-o", str(exe)],
                check=True,
                capture_output=True,
                text=True,
            )
            built[name, causal] = (exe, config)
    return space, device, built


@pytest.mark.parametrize(("name", "causal"), BUILDS, ids=[f"{n}-{'causal' if c else 'full'}" for n, c in BUILDS])
def test_every_query_block_once_and_every_visible_key(binaries, name, causal):
    space, device, built = binaries
    exe, config = built[name, causal]
    for batch, sq, sk, hq, hkv in SHAPES:
        problem = Problem(
            batch=batch, seqlen_q=sq, seqlen_k=sk, heads_q=hq, heads_kv=hkv, head_dim=CONFIGS[name][0], causal=causal
        )
        grid = space.launch(config, problem, device).grid
        run = subprocess.run(
            [str(exe), *map(str, grid), *map(str, (batch, sq, sk, hq, hkv))],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0 and run.stdout.startswith("ok"), (name, problem.slug(), grid, run.stdout, run.stderr)


def _run(exe, grid, batch, sq, sk, hq, hkv, *extra) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(exe), *map(str, grid), *map(str, (batch, sq, sk, hq, hkv)), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_dynamic_scheduler_covers_every_unit_once_on_any_grid(binaries, causal):
    """The dynamic order does not depend on the grid matching the units: fewer CTAs than SMs, one CTA, more CTAs
    than units (they retire without a unit); each time every unit once and the counter zeroed at the end."""
    exe, _ = binaries[2]["dynamic", causal]
    batch, sq, sk, hq, hkv = 2, 1000, 1000, 8, 2
    units = -(-sq // 128) * hq * batch
    for gx in (1, 2, 7, units - 1, units, units + 3):
        run = _run(exe, (gx, 1, 1), batch, sq, sk, hq, hkv)
        assert run.returncode == 0 and run.stdout.split()[:2] == ["ok", str(units)], (gx, run.stdout)


def test_the_dynamic_scheduler_balances_long_causal_gqa(binaries):
    """Long causal GQA (28 query heads over 4 KV heads, N 16384, d128 defaults, 132 CTAs): the static snake's
    busiest CTA has 1.16x the mean load in key blocks (H200: persistent 629 TFLOPS against 720 for one CTA per
    block); units fetched from the counter in the order CTAs finish leave under 1%."""
    space, device, built = binaries
    problem = Problem(batch=1, seqlen_q=16384, heads_q=28, heads_kv=4, head_dim=128, causal=True)
    ratios = {}
    for name in ("static_snake", "dynamic"):
        exe, config = built[name, True]
        grid = space.launch(config, problem, device).grid
        run = _run(exe, grid, 1, 16384, 16384, 28, 4, "units-only")
        assert run.returncode == 0, run.stdout
        _, units, max_load, total = run.stdout.split()
        assert int(units) == 28 * 128
        ratios[name] = int(max_load) / (int(total) / grid[0])
    assert ratios["static_snake"] > 1.15 and ratios["dynamic"] < 1.01, ratios


def _balance(exe, grid, batch, sq, hq, hkv) -> tuple[int, float]:
    """(units visited, the busiest cluster's key blocks over the mean per cluster of the grid's x)."""
    run = _run(exe, grid, batch, sq, sq, hq, hkv, "units-only")
    assert run.returncode == 0, run.stdout
    _, units, max_load, total = run.stdout.split()
    return int(units), int(max_load) / (int(total) / grid[0])


@pytest.mark.parametrize(
    ("batch", "sq", "hq", "hkv"), [(4, 2048, 8, 8), (2, 4096, 8, 8), (1, 8192, 16, 8), (3, 3000, 12, 12)]
)
def test_sections_take_the_longest_causal_units_first(binaries, batch, sq, hq, hkv):
    """Causal, 4-8 waves of units on 132 CTAs (d128 defaults): fetched from the counter one head after another, the
    last heads' longest units start in the last wave and the busiest CTA has 1.12-1.30x the mean load in key blocks;
    in sections (unit_order=1) 1.003-1.031x, with only the last heads in a section (unit_order=2) 1.03-1.09x. Every
    unit is visited once in each order."""
    space, device, built = binaries
    problem = Problem(batch=batch, seqlen_q=sq, heads_q=hq, heads_kv=hkv, head_dim=128, causal=True)
    ratios = {}
    for name in ("dynamic", "sections_dynamic", "last_section_dynamic"):
        exe, config = built[name, True]
        units, ratios[name] = _balance(exe, space.launch(config, problem, device).grid, batch, sq, hq, hkv)
        assert units == batch * hq * -(-sq // 128)
    assert ratios["dynamic"] > 1.1 and ratios["sections_dynamic"] < 1.05, ratios
    assert ratios["last_section_dynamic"] < min(1.1, ratios["dynamic"] - 0.03), ratios


SECTIONED = [name for name in CONFIGS if name in CAUSAL_ONLY]


@pytest.mark.parametrize("name", SECTIONED)
def test_sections_visit_every_query_block_once_where_there_are_several(binaries, name):
    """Shapes of several sections, some a K/V head wider than the others, the last section after heads one after
    another, on the grid the space file computes and (persistent) on smaller ones: every query block visited exactly
    once per split (the check's exit status)."""
    space, device, built = binaries
    exe, config = built[name, True]
    for batch, sq, hq, hkv in [(24, 2048, 8, 2), (7, 4096, 12, 4), (3, 8192, 10, 10), (40, 512, 6, 3)]:
        problem = Problem(batch=batch, seqlen_q=sq, heads_q=hq, heads_kv=hkv, head_dim=CONFIGS[name][0], causal=True)
        grid = space.launch(config, problem, device).grid
        smaller = [(g * config["cta_mode"], 1, 1) for g in (17, 64)] if config["persistent"] else []
        for g in [grid, *smaller]:
            units, _ = _balance(exe, g, batch, sq, hq, hkv)
            assert units > 0, (name, problem.slug(), g)


def test_a_broken_schedule_is_caught(binaries):
    """The check is not vacuous: a grid that drops a column of query blocks fails it."""
    space, device, built = binaries
    exe, config = built["one_per_block", False]  # a persistent grid covers every unit with fewer CTAs too
    problem = Problem(batch=2, seqlen_q=1000, heads_q=8, heads_kv=2, head_dim=128)
    gx, gy, gz = space.launch(config, problem, device).grid
    run = subprocess.run(
        [str(exe), str(gx - 1), str(gy), str(gz), "2", "1000", "1000", "8", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1 and "not visited exactly once" in run.stdout


def test_a_split_left_out_is_caught(binaries):
    """With split-KV every query block takes kv_splits units: a grid one CTA short leaves a split out."""
    space, device, built = binaries
    exe, config = built["split4_one_per_block", True]
    problem = Problem(batch=1, seqlen_q=1000, heads_q=2, heads_kv=1, head_dim=128, causal=True)
    gx, gy, gz = space.launch(config, problem, device).grid
    assert gx == 4 * 8  # 8 query blocks of 128 rows, 4 splits each
    run = _run(exe, (gx - 1, gy, gz), 1, 1000, 1000, 2, 1)
    assert run.returncode == 1 and "not visited exactly once per split" in run.stdout


def _tail_units(config: dict, problem: Problem, ctas: int) -> tuple[int, int, int]:
    """(tiles of the last wave, the splits each takes, work units) for a grid of `ctas` clusters, as the space file
    and the kernel compute them (TileScheduler), here from the definition: r = T mod G tiles, min(S, G / r) each."""
    block_m, cta = 64 * config["consumer_wgs"], config["cta_mode"]
    tiles = problem.batch * problem.heads_q * -(-problem.seqlen_q // (block_m * cta))
    tail = tiles % ctas
    splits = min(config["tail_splits"], ctas // tail) if tail else 1
    return tail, splits, tiles - tail + tail * splits


# (batch, seqlen_q, seqlen_k, heads_q, heads_kv) and grids (clusters) for the tail split: with the grid's G the
# last wave is empty (r = 0: G divides T), holds a few tiles (r * S <= G), too many for S splits each (r * S > G:
# the split count clamped to G / r) or more than half of G (no split); one wave holds every tile (T < G, a grid
# larger than the space file's); one CTA; causal, GQA, seqlen_q != seqlen_k, tails of a key block
TAIL_SHAPES = [
    (2, 1000, 1000, 8, 2),
    (3, 777, 1234, 4, 4),
    (1, 300, 301, 2, 2),
    (2, 2048, 256, 8, 4),
    (1, 100, 351, 1, 1),
]
TAIL_GRIDS = (1, 2, 3, 5, 7, 9, 12, 16, 20, 31, 45, 64, 100)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", TAIL)
def test_the_tail_split_covers_every_key_once_on_any_grid(binaries, name, causal):
    """Every (query block, key block) a row sees exactly once over the units, each tile split into the count the
    grid gives (the check derives it from the grid alone), split units numbered after the whole tiles and their
    partials within G; the unit count is T - r + r s. Each (r, s) case above occurs among the shapes and grids."""
    built = binaries[2]
    exe, config = built[name, causal]
    cases = set()
    for batch, sq, sk, hq, hkv in TAIL_SHAPES:
        problem = Problem(batch=batch, seqlen_q=sq, seqlen_k=sk, heads_q=hq, heads_kv=hkv, head_dim=CONFIGS[name][0])
        tiles = _tail_units(config, problem, 10**9)[0]
        for ctas in sorted({*TAIL_GRIDS, tiles - 1, tiles, tiles + 1, 2 * tiles} - {0}):
            tail, splits, units = _tail_units(config, problem, ctas)
            run = _run(exe, (ctas * config["cta_mode"], 1, 1), batch, sq, sk, hq, hkv)
            assert run.returncode == 0 and run.stdout.split()[:2] == ["ok", str(units * config["cta_mode"])], (
                name,
                problem.slug(),
                ctas,
                run.stdout,
            )
            cases.add(
                "r=0"
                if not tail
                else "T<G"
                if tail == tiles
                else "clamped"
                if tail * config["tail_splits"] > ctas
                else "full"
                if splits == config["tail_splits"]
                else "?"
            )
            cases.add("split" if splits > 1 else "unsplit")
    assert cases >= {"r=0", "T<G", "clamped", "full", "split", "unsplit"}, cases


def test_the_tail_split_fills_the_last_wave_of_the_measured_gap(binaries):
    """d64 non-causal B2 H10 N4096 (H200: 428 TFLOPS against cuDNN's 453): 440 tiles of 192 rows on 132 SMs leave
    44 in the last wave; with tail_splits 3 they are 132 units of a third of the keys each, and the busiest CTA
    carries 3 + 1/3 tiles' key blocks instead of 4."""
    space, device, built = binaries
    exe, config = built["tail3_d64", False]
    problem = Problem(batch=2, seqlen_q=4096, heads_q=10, head_dim=64)
    grid = space.launch(config, problem, device).grid
    assert grid == (132, 1, 1)
    run = _run(exe, grid, 2, 4096, 4096, 10, 10, "units-only")
    _, units, max_load, total = run.stdout.split()
    assert run.returncode == 0 and int(units) == 440 - 44 + 3 * 44
    assert int(max_load) == 3 * 32 + 32 // 3 + 1 and int(total) == 440 * 32  # 32 key blocks a tile, 11 in a split


@pytest.mark.parametrize(
    "fault, caught",
    [
        ("whole_tiles = units - tail;", "whole_tiles = units - tail + 1;"),  # a whole tile numbered among the split
        (
            "tail_splits = tail == 0 ? 1 : min(kTailSplits, stride / tail);",
            "tail_splits = tail == 0 ? 1 : kTailSplits;",
        ),
    ],
    ids=["numbering", "no_clamp"],
)
def test_a_broken_tail_split_is_caught(tmp_path, fault, caught):
    """Planted faults in the scheduler's tail split (a copy of kernel_src with one line changed) fail the check."""
    src = tmp_path / "kernel_src"
    shutil.copytree(KERNEL_SRC, src)
    header = src / "sm90" / "tile_scheduler.cuh"
    text = header.read_text()
    assert fault in text
    header.write_text(text.replace(fault, caught))
    space, device = load_space("sm90"), limits_for_arch(90)
    problem = Problem(batch=2, seqlen_q=1000, heads_q=8, heads_kv=2, head_dim=128)
    config = complete(space, {"tail_splits": 4}, problem, device).config
    flags = [f"-D{k}={v}" for k, v in space.macros(config, problem, device).items()]
    exe = tmp_path / "check"
    subprocess.run(
        ["nvcc", "-std=c++17", "-O1", "-x", "cu", "-I", str(src), *flags, str(CHECK), "-o", str(exe)],
        check=True,
        capture_output=True,
    )
    failed = [ctas for ctas in (5, 20, 31) if _run(exe, (ctas, 1, 1), 2, 1000, 1000, 8, 2).returncode != 0]
    assert failed, "the planted fault went unnoticed"
