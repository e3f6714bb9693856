"""sm90's kv_splits knob (split-KV) in the space file: off by default (no workspace, the grid of today's kernel),
refused with a message that says why and what to set where the problem already fills the GPU, and the launch
geometry and workspace sizes it implies: kv_splits units per query block in the grid, the counters and partials
the kernel indexes (epilogue.cuh's SplitSlot). No GPU, no nvcc."""

from __future__ import annotations

import pytest

from tuner.devices import limits_for_arch
from tuner.problem import Problem
from tuner.space import load_space

H200 = limits_for_arch(90)  # 132 SMs
FEW = Problem(batch=1, seqlen_q=1024, heads_q=8, heads_kv=2, head_dim=128, causal=True)  # 8 heads x 8 blocks = 64 units
CLUSTER = {"cta_mode": 2, "scheduler": 0, "producer_regs": 32, "consumer_regs": 232}


@pytest.fixture(scope="module")
def space():
    return load_space("sm90")


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_no_split_by_default_and_no_workspace(space, head_dim):
    default = space.defaults(head_dim)
    assert default["kv_splits"] == 1
    problem = Problem(batch=1, seqlen_q=1024, heads_q=8, head_dim=head_dim)
    geometry = space.launch(default, problem, H200)
    assert geometry.abi["split_counter_bytes"] == 0 and geometry.abi["split_partial_bytes"] == 0
    assert "FT_KV_SPLITS" in space.macros(default, problem, H200)


def test_the_grid_takes_kv_splits_units_per_query_block(space):
    persistent = space.defaults(128)  # dynamic scheduler, one CTA per SM at most
    assert space.launch(persistent, FEW, H200).grid == (64, 1, 1)
    assert space.launch({**persistent, "kv_splits": 2}, FEW, H200).grid == (128, 1, 1)
    assert space.launch({**persistent, "kv_splits": 3}, FEW, H200).grid == (132, 1, 1)  # 192 units on 132 SMs
    per_block = {**persistent, "persistent": 0, "scheduler": 0}
    assert space.launch({**per_block, "kv_splits": 4}, FEW, H200).grid == (32, 8, 1)
    cluster = space.validate({**CLUSTER, "kv_splits": 2}, partial=True, head_dim=128)
    assert space.launch(cluster, FEW, H200).grid == (128, 1, 1)  # 32 clusters x 2 splits, 2 CTAs each
    cluster_per_block = {**cluster, "persistent": 0}
    assert space.launch(cluster_per_block, FEW, H200).grid == (4 * 2 * 2, 8, 1)  # 4 clusters a head, 2 splits


def test_the_workspace_is_what_the_kernel_indexes(space):
    """Counters: one uint32 per consumer warpgroup of every query block (SplitSlot::slot); partials: per split of
    each, head_dim / 2 O values and 2 LSEs for each of its 128 threads, fp32."""
    for partial, blocks, wgs in (({}, 64, 2), (CLUSTER, 64, 2), ({"consumer_wgs": 3, "block_n": 64}, 48, 3)):
        config = space.validate({**partial, "kv_splits": 4}, partial=True, head_dim=128)
        abi = space.launch(config, FEW, H200).abi
        assert abi["split_counter_bytes"] == 4 * blocks * wgs
        assert abi["split_partial_bytes"] == 4 * blocks * wgs * 4 * 128 * (128 // 2 + 2)


def test_splits_are_refused_where_every_sm_has_work(space):
    config = {**space.defaults(128), "kv_splits": 2}
    many = Problem(batch=4, seqlen_q=4096, heads_q=32, head_dim=128)  # 4096 units
    reasons = space.violations(config, many, H200)
    assert [r.split(":", 1)[0] for r in reasons] == ["kv_splits_few_units"], reasons
    assert "4096" in reasons[0] and "132 SMs" in reasons[0] and "set kv_splits=1" in reasons[0]
    assert space.check({**config, "kv_splits": 1}, many, H200) is None
    assert space.check(config, FEW, H200) is None
    edge = Problem(batch=1, seqlen_q=128 * 132, heads_q=1, head_dim=128)  # 132 units: one per SM already
    assert space.check(config, edge, H200) is not None
    assert space.check(config, Problem(batch=1, seqlen_q=128 * 131, heads_q=1, head_dim=128), H200) is None
    cluster = space.validate({**CLUSTER, "kv_splits": 2}, partial=True, head_dim=128)  # two CTAs a unit
    assert space.check(cluster, Problem(batch=1, seqlen_q=256 * 65, heads_q=1, head_dim=128), H200) is None
    reasons = space.violations(cluster, Problem(batch=1, seqlen_q=256 * 66, heads_q=1, head_dim=128), H200)
    assert [r.split(":", 1)[0] for r in reasons] == ["kv_splits_few_units"], reasons
