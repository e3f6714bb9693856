"""sm90's tail_splits knob (the last, partly filled wave's tiles split over their keys) in the space file: off by
default (no workspace, today's grid), refused with a message that says what to set where it cannot run, a workspace
bounded by the GPU (not the problem) that covers every index the kernel makes, and the [[defaults]] rules that turn
it on. The expected values are computed here from the definitions, independently of the space file's expressions.
No GPU, no nvcc."""

from __future__ import annotations

import itertools
import math

import pytest

from tuner.devices import limits_for_arch
from tuner.problem import Problem
from tuner.space import load_space

H200 = limits_for_arch(90)  # 132 SMs
SPACE = load_space("sm90")
CLUSTER = {"cta_mode": 2, "scheduler": 0, "producer_regs": 32, "consumer_regs": 232}
TWO_CTAS = {"ctas_per_sm": 2, "consumer_wgs": 1, "producer_regs": 24, "consumer_regs": 232, "block_n": 64}
GAP = Problem(batch=2, seqlen_q=4096, heads_q=10, head_dim=64, dtype="bf16")  # 440 tiles of 192 rows: 44 left over


def _tiles(config: dict, problem: Problem) -> int:
    rows = 64 * config["consumer_wgs"] * config["cta_mode"]
    return problem.batch * problem.heads_q * math.ceil(problem.seqlen_q / rows)


def _ctas(config: dict) -> int:
    return H200.num_sms * config["ctas_per_sm"] // config["cta_mode"]


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_no_tail_split_by_default_and_no_workspace(head_dim):
    default = SPACE.defaults(head_dim)
    assert default["tail_splits"] == 1
    geometry = SPACE.launch(default, GAP, H200)
    assert geometry.abi["split_counter_bytes"] == 0 and geometry.abi["split_partial_bytes"] == 0
    assert SPACE.macros(default, GAP, H200)["FT_TAIL_SPLITS"] == 1


@pytest.mark.parametrize("splits", [2, 3, 4])
def test_the_grid_is_todays(splits):
    """The split units are taken by the same persistent CTAs: min(G, tiles) of them, whatever tail_splits says."""
    for head_dim, partial in ((64, {}), (128, {}), (128, CLUSTER), (128, TWO_CTAS)):
        base = SPACE.validate(partial, partial=True, head_dim=head_dim)
        for problem in (GAP, Problem(batch=1, seqlen_q=1000, heads_q=4, head_dim=head_dim)):
            problem = Problem(**{**problem.to_dict(), "head_dim": head_dim})
            tail = {**base, "tail_splits": splits}
            assert SPACE.check(tail, problem, H200) is None
            assert SPACE.launch(tail, problem, H200).grid == SPACE.launch(base, problem, H200).grid


def test_it_needs_persistent_ctas_and_excludes_kv_splits():
    per_block = {**SPACE.defaults(128), "persistent": 0, "scheduler": 0, "tail_splits": 2}
    reasons = SPACE.violations(per_block, GAP, H200)
    assert [r.split(":", 1)[0] for r in reasons] == ["tail_splits_persistent"], reasons
    assert "set persistent=1 or tail_splits=1" in reasons[0]
    few = Problem(batch=1, seqlen_q=1024, heads_q=4, head_dim=128)  # 32 units: kv_splits may run
    both = {**SPACE.defaults(128), "kv_splits": 2, "tail_splits": 2}
    reasons = SPACE.violations(both, few, H200)
    assert [r.split(":", 1)[0] for r in reasons] == ["tail_splits_or_kv_splits"], reasons
    assert "set kv_splits=1 or tail_splits=1" in reasons[0]
    d256 = SPACE.validate({"persistent": 1, "q_stages": 1, "tail_splits": 4}, partial=True, head_dim=256)
    assert SPACE.check(d256, Problem(batch=1, seqlen_q=4096, heads_q=16, head_dim=256), H200) is None


@pytest.mark.parametrize(
    "head_dim, partial", [(64, {}), (128, {}), (256, {"persistent": 1, "q_stages": 1}), (128, CLUSTER), (128, TWO_CTAS)]
)
def test_the_workspace_holds_every_index_the_kernel_makes_on_any_problem(head_dim, partial):
    """Counters: slot (split tile x cta_mode + rank) x consumer_wgs + wg < bytes / 4; partials of 64 rows, head_dim
    / 2 + 2 fp32 per thread: (slot x s + split) < bytes / (4 x 64 x (head_dim + 4)); for every tail r of G. The same
    sizes for every problem: one workspace per stream serves them all."""
    config = SPACE.validate({**partial, "tail_splits": 4}, partial=True, head_dim=head_dim)
    ctas, cta, wgs = _ctas(config), config["cta_mode"], config["consumer_wgs"]
    problems = [
        Problem(batch=b, seqlen_q=n, heads_q=h, head_dim=head_dim)
        for b, n, h in ((2, 4096, 10), (1, 100, 1), (8, 8000, 32))
    ]
    sizes = {
        tuple(SPACE.launch(config, p, H200).abi[k] for k in ("split_counter_bytes", "split_partial_bytes"))
        for p in problems
    }
    assert len(sizes) == 1
    ((counter_bytes, partial_bytes),) = sizes
    need_counters = need_partials = 0
    for r in range(1, ctas):
        s = min(4, ctas // r)
        if s > 1:
            need_counters = max(need_counters, r * cta * wgs)
            need_partials = max(need_partials, r * cta * wgs * s)
    assert need_counters * 4 <= counter_bytes < (need_counters + cta * wgs) * 4
    assert need_partials * 4 * 64 * (head_dim + 4) <= partial_bytes == ctas * cta * wgs * 4 * 64 * (head_dim + 4)
    assert need_partials == ctas * cta * wgs  # on 132 SMs some r s is G (33 x 4): no byte of it is idle


def test_the_split_count_the_space_computes_is_the_kernels():
    """tail_splits_run (the derived value) = min(S, G / r) for r = tiles mod G > 0 with more tiles than G, else 1."""
    for head_dim, partial in ((64, {}), (128, {}), (128, CLUSTER), (128, TWO_CTAS)):
        for splits, b, h, n in itertools.product((2, 3, 4), (1, 2, 4), (7, 10, 16, 40), (1000, 2048, 4096)):
            config = SPACE.validate({**partial, "tail_splits": splits}, partial=True, head_dim=head_dim)
            problem = Problem(batch=b, seqlen_q=n, heads_q=h, head_dim=head_dim)
            tiles, ctas = _tiles(config, problem), _ctas(config)
            r = tiles % ctas if tiles > ctas else 0
            env = SPACE.environment(config, problem, H200)
            assert env["tail_tiles"] == r
            assert env["tail_splits_run"] == (min(splits, ctas // r) if r else 1), (config, problem.slug())


def _rule(problem: Problem, config: dict) -> int:
    """The tail rule from its statement: non-causal, persistent, no kv_splits; 2 where 2 r <= G, fewer than 8 waves
    (tiles < 8 G) and each split keeps >= 1024 keys, r > 0 the tiles of the last wave (more tiles than G); else 1."""
    if problem.causal or not config["persistent"] or config["kv_splits"] > 1:
        return 1
    tiles, ctas = _tiles(config, problem), _ctas(config)
    r = tiles % ctas if tiles > ctas else 0
    return 2 if r and 2 * r <= ctas and tiles < 8 * ctas and problem.seqlen_k >= 2 * 1024 else 1


PROBLEMS = [
    Problem(batch=b, seqlen_q=n, heads_q=h, head_dim=d, dtype="bf16", causal=c)
    for b, h, n, d, c in itertools.product(
        (1, 2, 3, 4, 8), (8, 10, 12, 16, 28, 40), (577, 1000, 2048, 3000, 4096, 8192), (64, 128, 256), (False, True)
    )
]


def test_the_rule_splits_the_last_wave_where_it_is_at_most_half_full_and_every_default_is_feasible():
    chosen = set()
    for problem in PROBLEMS:
        config = SPACE.defaults(problem=problem, device=H200)
        assert SPACE.check(config, problem, H200) is None, (problem.slug(), config)
        assert config["tail_splits"] == _rule(problem, config), problem.slug()
        chosen.add(config["tail_splits"])
    assert chosen == {1, 2}


def test_the_rule_fills_the_measured_gaps():
    """H200 (BENCHMARKS.md, sessions 10-12): d64 non-causal B2 H10 N4096 and B1 H40 N2048 (440 tiles of 192 rows: 44
    in the last wave) lost to cuDNN unsplit and lead it with their tail split in 2 (88 units; 3 were slower). Causal
    ones, and d256's default (one CTA per block), are not split; nor is d64 B16 H32 N1024 (3072 tiles: 36 in the last
    wave), where 2 splits of 512 keys ran 0.97x (2026-12-04)."""
    cases = ((2, 10, 4096, False, 2), (1, 40, 2048, False, 2), (2, 10, 4096, True, 1), (16, 32, 1024, False, 1))
    for b, h, n, causal, splits in cases:
        problem = Problem(batch=b, seqlen_q=n, heads_q=h, head_dim=64, causal=causal)
        config = SPACE.defaults(problem=problem, device=H200)
        assert (config["consumer_wgs"], config["tail_splits"]) == (3, splits), problem.slug()
    # many waves: the half tile saved is small beside the split's cost to every unit (2026-12-04, 0.952x at d128
    # B1 H40 N8192: 2,560 tiles, 19.4 waves, 52 in the last); at 7.3 waves (B1 H40:8 N3000, 1.04x split) it pays
    many = Problem(batch=1, seqlen_q=8192, heads_q=40, head_dim=128)
    assert SPACE.defaults(problem=many, device=H200)["tail_splits"] == 1
    seven = Problem(batch=1, seqlen_q=3000, heads_q=40, heads_kv=8, head_dim=128)
    assert SPACE.defaults(problem=seven, device=H200)["tail_splits"] == 2
    d256 = Problem(batch=1, seqlen_q=4096, heads_q=40, head_dim=256)
    assert SPACE.defaults(problem=d256, device=H200)["tail_splits"] == 1
    short = Problem(
        batch=1, seqlen_q=1000, heads_q=20, head_dim=128
    )  # 160 tiles, r = 28, but 1000 keys: 1024 x 2 > 1000
    assert SPACE.defaults(problem=short, device=H200)["tail_splits"] == 1
