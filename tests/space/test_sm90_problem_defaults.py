"""The sm90 space's defaults per problem (``[[defaults]]``): 2 consumer warpgroups for non-causal d64
problems whose 192-row units take nearly as many waves as 128-row ones (>= 1.3x the time by waves, or >= 1.12x with
>= 2048 keys and a last wave of 192-row units over half full), with 192-key blocks where those pad the keys no more
than 176-key ones and 176-key blocks otherwise, where either pads the keys < 1.1x as much as 128-key ones; 3
warpgroups elsewhere at d64, causal included, with 96-key blocks and ping-pong where non-causal 3 warpgroups run 1-4
waves of >= 2048 keys unsplit; every such default is feasible. The wave counts and work are computed here independently of the space file's expressions."""

from __future__ import annotations

import itertools
import math

from tuner.devices import limits_for_arch
from tuner.problem import Problem
from tuner.space import load_space

SPACE = load_space("sm90")
H200 = limits_for_arch(90)


def _units(problem: Problem, block_m: int) -> int:
    return problem.batch * problem.heads_q * math.ceil(problem.seqlen_q / block_m)


def _waves(problem: Problem, block_m: int) -> int:
    return math.ceil(_units(problem, block_m) / H200.num_sms)


def _splits(problem: Problem, block_m: int) -> int:
    """The largest kv_splits whose split units fit one wave of the H200's SMs (one CTA each) with >= 512 keys
    per split: the split-KV rules, here from the tile's rows (every default here is one CTA per unit)."""
    fits = [
        s for s in (1, 2, 3, 4, 6, 8) if s * _units(problem, block_m) <= H200.num_sms and problem.seqlen_k >= 512 * s
    ]
    return max(fits) if len(fits) > 1 else 1


PROBLEMS = [
    Problem(batch=b, seqlen_q=n, heads_q=h, head_dim=d, dtype=t, causal=c)
    for b, h, n, d, t, c in itertools.product(
        (1, 2, 3, 8, 64),
        (8, 12, 16, 40),
        (197, 577, 1000, 2048, 4096, 16384),
        (64, 128),
        ("fp16", "bf16"),
        (False, True),
    )
]


def test_d64_warpgroups_follow_the_wave_counts_and_every_default_is_feasible():
    for problem in PROBLEMS:
        config = SPACE.defaults(problem=problem, device=H200)
        assert SPACE.check(config, problem, H200) is None, (problem.slug(), config)
        splits = _splits(problem, 192 if problem.head_dim == 64 else 128)
        if problem.head_dim != 64:
            expected = 2
        elif splits > 1 or problem.causal:
            # split keys fill the wave at 3 warpgroups' per-row speed; causal, 3 warpgroups run 1.02-1.11x as fast
            # (padded warpgroups and the diagonal cost little)
            expected = 3
        else:  # 3 warpgroups' waves cost 1.5x a 2-warpgroup wave; they stay unless that costs >= 1.3x, or >= 1.12x
            # with >= 2048 keys and their last wave over half full
            ratio = 192 * _waves(problem, 192) / (128 * _waves(problem, 128))
            last = _units(problem, 192) % H200.num_sms if _units(problem, 192) > H200.num_sms else 0
            long_full = problem.seqlen_k >= 2048 and 2 * last > H200.num_sms
            expected = 2 if ratio >= 1.3 or (ratio >= 1.12 and long_full) else 3
        assert config["consumer_wgs"] == expected, problem.slug()
        assert config["kv_splits"] == splits, problem.slug()
        if problem.head_dim == 64:
            assert (config["producer_regs"], config["consumer_regs"]) == ((24, 240) if expected == 2 else (32, 160))
            # 2 warpgroups take the widest of 192 and 176 keys that pads the keys least, where that pads < 1.1x as
            # much as 128-key blocks
            keys = {n: n * math.ceil(problem.seqlen_k / n) for n in (128, 176, 192)}
            wide = 192 if keys[192] <= keys[176] else 176
            pingpong = expected == 3 and _pingpong_rule(problem, config)
            block_n = 96 if pingpong else wide if expected == 2 and keys[wide] < 1.1 * keys[128] else 128
            assert (config["block_n"], config["pingpong"]) == (block_n, int(pingpong)), problem.slug()


def _pingpong_rule(problem: Problem, config: dict) -> bool:
    """Non-causal d64 on 3 warpgroups at 1-4 waves of 192-row units (one persistent CTA per SM) without a split of
    the keys, >= 2048 keys: 96-key blocks with ping-pong."""
    units = _units(problem, 192)
    return (
        not problem.causal
        and config["kv_splits"] == 1
        and config["tail_splits"] == 1
        and H200.num_sms < units < 4 * H200.num_sms
        and problem.seqlen_k >= 2048
    )


def test_both_outcomes_occur_among_the_problems():
    configs = [SPACE.defaults(problem=p, device=H200) for p in PROBLEMS if p.head_dim == 64]
    assert {(c["consumer_wgs"], c["block_n"]) for c in configs} == {(2, 128), (2, 176), (2, 192), (3, 128), (3, 96)}


def test_the_measured_shapes_get_what_was_faster():
    """H200, 2026-12-02 (BENCHMARKS.md, session 10): 2 warpgroups 1.25x at B64 H12 N197 and 1.15x at B1 H16
    N2048; 3 warpgroups faster at B2 H10 N4096, B1 H40 N2048, B4 H8 N8192, B3 H12 N2000. 2026-12-04, with padded
    warpgroups skipped: 2 warpgroups 1.06x at B64 H16 N256 and 1.09x at B64 H12 N197; 3 faster at B32 H12 N512,
    B32 H16 N577, B16 H16 N1024, B32 H16 N384, B24 H16 N768, B16 H12 N640 and B8 H16 N1100."""
    for (b, h, n), wgs in {
        # H100, 2026-12-05 (session 29): 2 warpgroups 1.04-1.06x at 3 against 4 waves of >= 2048 keys; 3 faster
        # where the last 192-row block is a third of rows, or 3 warpgroups' last wave is nearly empty
        (1, 16, 4096): 2,
        (1, 32, 2048): 2,
        (1, 8, 8192): 2,
        (1, 28, 2304): 2,
        (1, 32, 1600): 3,
        (1, 40, 1792): 3,
        (2, 28, 3584): 3,
        (6, 20, 1792): 3,
        (64, 16, 256): 2,
        (32, 12, 512): 3,
        (32, 16, 577): 3,
        (16, 16, 1024): 3,
        (32, 16, 384): 3,
        (24, 16, 768): 3,
        (16, 12, 640): 3,
        (8, 16, 1100): 3,
        (64, 12, 197): 2,
        (1, 16, 2048): 2,
        (2, 10, 4096): 3,
        (1, 40, 2048): 3,
        (4, 8, 8192): 3,
        (3, 12, 2000): 3,
    }.items():
        problem = Problem(batch=b, seqlen_q=n, heads_q=h, head_dim=64)
        assert SPACE.defaults(problem=problem, device=H200)["consumer_wgs"] == wgs, (b, h, n)


def test_the_d64_pingpong_rule_fires_where_measured_to_win():
    """H100, 2026-12-07 (BENCHMARKS.md, session 40): 96-key blocks with ping-pong 1.015-1.048x the default at 2.9
    waves (B1 H24 N3072, B1 H12 N6144), 1.007-1.049x at 12 of 14 held-out shapes of 1.6-3.9 waves; not past 4 waves
    (1.00x at B2 H12 N5120, 0.92-0.95x at 16-21 waves), nor on top of the tail split (B2 H10 N4096, 0.97-0.99x)."""
    for (dtype, b, h, n), fires in {
        ("bf16", 1, 24, 3072): True,
        ("bf16", 1, 12, 6144): True,
        ("bf16", 1, 4, 12288): True,
        ("fp16", 6, 4, 2048): True,
        ("bf16", 2, 12, 5120): False,
        ("fp16", 4, 32, 4096): False,
        ("fp16", 2, 10, 4096): False,
    }.items():
        config = SPACE.defaults(problem=Problem(batch=b, seqlen_q=n, heads_q=h, head_dim=64, dtype=dtype), device=H200)
        assert (config["block_n"] == 96 and config["pingpong"] == 1) == fires, (dtype, b, h, n, config)
        assert SPACE.check(config, Problem(batch=b, seqlen_q=n, heads_q=h, head_dim=64, dtype=dtype), H200) is None


def test_causal_d64_takes_3_warpgroups_at_the_measured_shapes():
    """H200, 2026-12-04 (BENCHMARKS.md; tests/gpu/wgs_rule_shapes.toml), with warpgroups whose rows are all padding
    skipping their key blocks: 3 warpgroups 1.02-1.11x as fast as 2 at B32 H16 N512, B16 H16 N1024, B8 H32 N1000,
    B16 H24 N768, B8 H16 N1280, B4 H32 N1536, B4 H16 N2048, B48 H12 N384, B16 H20 N900 and B64 H8 N300; 2 won only
    at B24 H16 N640, by 1.3% (3 is kept there: no rule over the shape picks it out)."""
    for b, h, n in ((32, 16, 512), (16, 16, 1024), (8, 32, 1000), (16, 24, 768), (8, 16, 1280), (4, 32, 1536)):
        for dtype in ("fp16", "bf16"):
            problem = Problem(batch=b, seqlen_q=n, heads_q=h, head_dim=64, dtype=dtype, causal=True)
            assert SPACE.defaults(problem=problem, device=H200)["consumer_wgs"] == 3, problem.slug()
    for b, h, n in ((4, 16, 2048), (48, 12, 384), (16, 20, 900), (64, 8, 300), (24, 16, 640)):
        problem = Problem(batch=b, seqlen_q=n, heads_q=h, head_dim=64, causal=True)
        assert SPACE.defaults(problem=problem, device=H200)["consumer_wgs"] == 3, problem.slug()


def test_every_split_count_occurs_among_few_unit_problems():
    """With as many queries as keys a split of >= 512 keys has >= 4 query blocks' worth of units per head: 6 and
    8 splits come with few queries over many keys (a chunk of a prompt over its cache)."""
    problems = [
        Problem(batch=1, seqlen_q=nq, seqlen_k=max(nq, nk), heads_q=h, head_dim=d, causal=c)
        for nq, nk, h, d, c in itertools.product(
            (128, 512, 1024, 4096), (1024, 4096, 16384), (1, 2, 4, 8), (64, 128, 256), (False, True)
        )
    ]
    chosen = {SPACE.defaults(problem=p, device=H200)["kv_splits"] for p in problems}
    assert chosen == {1, 2, 3, 4, 6, 8}


def test_the_split_kv_shapes_get_what_was_fastest():
    """H200, 2026-12-02 (BENCHMARKS.md, session 11): the fastest kv_splits of 1-8 (or within 1% of it) on
    tests/gpu/splitkv_shapes.toml and four more few-unit shapes, every other knob at the head dim's default."""
    for (b, h, kv, n, d, causal), splits in {
        (1, 8, 2, 1024, 128, True): 2,
        (1, 8, 8, 1024, 128, False): 2,
        (1, 4, 4, 2048, 64, False): 3,
        (1, 4, 1, 2048, 256, True): 2,
        (2, 4, 1, 512, 128, True): 1,
        (1, 4, 4, 4096, 128, False): 1,
        (1, 8, 8, 1024, 64, True): 2,
        (1, 4, 1, 2048, 128, True): 2,
        (1, 4, 4, 1024, 256, False): 2,
    }.items():
        problem = Problem(batch=b, seqlen_q=n, heads_q=h, heads_kv=kv, head_dim=d, causal=causal)
        assert SPACE.defaults(problem=problem, device=H200)["kv_splits"] == splits, problem.slug()


_TILE = {"persistent": 1, "q_stages": 1, "block_n": 64, "scheduler": 1}
D256_PROBLEMS = [
    Problem(batch=b, seqlen_q=n, heads_q=h, head_dim=256, dtype="bf16", causal=c)
    for b, h, n, c in itertools.product(
        (1, 2, 8, 32), (4, 16, 32), (300, 1024, 2047, 2048, 4096, 8192, 8193, 12288), (False, True)
    )
]


def test_d256_takes_the_persistent_tile_where_measured_to_win():
    """d256 problems whose keys are not split: causal ones of <= 8192 keys and < 16 waves of 128-row units (the last
    section) run the persistent one-Q-stage tile (64-key blocks, the dynamic scheduler); non-causal ones of < 2048
    keys run it with ping-pong; every other d256 problem keeps the head dim's own values of those knobs."""
    own = SPACE.defaults(256)
    outcomes = set()
    for problem in D256_PROBLEMS:
        config = SPACE.defaults(problem=problem, device=H200)
        assert SPACE.check(config, problem, H200) is None, problem.slug()
        split = config["kv_splits"] > 1
        if problem.causal:
            tile = not split and problem.seqlen_k <= 8192 and _units(problem, 128) < 16 * H200.num_sms
        else:
            tile = not split and problem.seqlen_k < 2048
        expected = {k: own[k] for k in (*_TILE, "pingpong")}
        if tile:
            expected |= _TILE | ({} if problem.causal else {"pingpong": 1})
        assert {k: config[k] for k in expected} == expected, problem.slug()
        outcomes.add((problem.causal, tile, split))
    assert {(c, t) for c, t, _ in outcomes} == {(False, False), (False, True), (True, False), (True, True)}
    assert any(split for _, _, split in outcomes)


def test_causal_d64_and_d128_take_the_study_winners_patterns_where_measured_to_win():
    """Causal d64 of >= 2048 keys and < 22 waves, unsplit: one barrier per K/V stage and units in sections (H100,
    session 45: 1.037-1.058x the default at four held-out shapes of 16-21 waves, the measured range). Causal d128 whose units run in
    sections (>= 2048 keys, < 16 waves of 128-row units, unsplit): ping-pong (1.015-1.050x at three). Elsewhere the
    head dim's values, sections where the older rule gives them; every such default is feasible."""
    own = {d: SPACE.defaults(d) for d in (64, 128)}
    outcomes = set()
    for problem in (p for p in PROBLEMS if p.causal):
        config = SPACE.defaults(problem=problem, device=H200)
        assert SPACE.check(config, problem, H200) is None, problem.slug()
        unsplit = config["kv_splits"] == 1
        block_m = 64 * config["consumer_wgs"]
        sections = problem.seqlen_k >= 2048 and _units(problem, block_m) < 16 * H200.num_sms
        if problem.head_dim == 64:
            fires = unsplit and problem.seqlen_k >= 2048 and _units(problem, block_m) < 22 * H200.num_sms
            expected = {"kv_barriers": 1 if fires else own[64]["kv_barriers"], "pingpong": own[64]["pingpong"]}
            expected["unit_order"] = 1 if fires or sections else own[64]["unit_order"]
        else:
            fires = unsplit and sections
            expected = {"kv_barriers": own[128]["kv_barriers"], "pingpong": 1 if fires else own[128]["pingpong"]}
            expected["unit_order"] = 1 if sections else own[128]["unit_order"]
        assert {k: config[k] for k in expected} == expected, problem.slug()
        outcomes.add((problem.head_dim, fires))
    assert outcomes == {(64, True), (64, False), (128, True), (128, False)}
    many = Problem(batch=8, seqlen_q=4096, heads_q=32, head_dim=64, causal=True)  # 43 waves: past the measured range
    assert SPACE.defaults(problem=many, device=H200)["kv_barriers"] == own[64]["kv_barriers"]
