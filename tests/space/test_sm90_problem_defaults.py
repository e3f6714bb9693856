"""The sm90 space's defaults per problem (``[[defaults]]``): 2 consumer warpgroups for non-causal d64
problems whose 192-row units take nearly as many waves as 128-row ones, 3 elsewhere at d64; every such
default is feasible. The wave counts are computed here independently of the space file's expression."""

from __future__ import annotations

import itertools
import math

from tuner.devices import limits_for_arch
from tuner.problem import Problem
from tuner.space import load_space

SPACE = load_space("sm90")
H200 = limits_for_arch(90)


def _waves(problem: Problem, block_m: int) -> int:
    units = problem.batch * problem.heads_q * math.ceil(problem.seqlen_q / block_m)
    return math.ceil(units / H200.num_sms)


PROBLEMS = [
    Problem(batch=b, seqlen_q=n, heads_q=h, head_dim=d, dtype=t, causal=c)
    for b, h, n, d, t, c in itertools.product(
        (1, 2, 3, 8, 64), (8, 12, 16, 40), (197, 577, 2048, 4096, 16384), (64, 128), ("fp16", "bf16"), (False, True)
    )
]


def test_d64_warpgroups_follow_the_wave_counts_and_every_default_is_feasible():
    for problem in PROBLEMS:
        config = SPACE.defaults(problem=problem, device=H200)
        assert SPACE.check(config, problem, H200) is None, (problem.slug(), config)
        if problem.head_dim != 64:
            expected = 2
        elif problem.causal:
            expected = 3
        else:  # 3 warpgroups' waves cost 1.5x a 2-warpgroup wave; they stay unless that costs >= 1.3x
            expected = 2 if 192 * _waves(problem, 192) >= 1.3 * 128 * _waves(problem, 128) else 3
        assert config["consumer_wgs"] == expected, problem.slug()
        if problem.head_dim == 64:
            assert (config["producer_regs"], config["consumer_regs"]) == ((24, 240) if expected == 2 else (32, 160))


def test_both_outcomes_occur_among_the_problems():
    chosen = {SPACE.defaults(problem=p, device=H200)["consumer_wgs"] for p in PROBLEMS if p.head_dim == 64}
    assert chosen == {2, 3}


def test_the_measured_shapes_get_what_was_faster():
    """H200, 2026-12-02 (BENCHMARKS.md, session 10): 2 warpgroups 1.25x at B64 H12 N197 and 1.15x at B1 H16
    N2048; 3 warpgroups faster at B2 H10 N4096, B1 H40 N2048, B4 H8 N8192, B3 H12 N2000."""
    for (b, h, n), wgs in {
        (64, 12, 197): 2,
        (1, 16, 2048): 2,
        (2, 10, 4096): 3,
        (1, 40, 2048): 3,
        (4, 8, 8192): 3,
        (3, 12, 2000): 3,
    }.items():
        problem = Problem(batch=b, seqlen_q=n, heads_q=h, head_dim=64)
        assert SPACE.defaults(problem=problem, device=H200)["consumer_wgs"] == wgs, (b, h, n)
