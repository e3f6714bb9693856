"""The real kernel families build without register spills: the knobs one at a time, and a seeded
sample of the statically feasible space (the space files' register estimates claim that much).
Needs nvcc, not a GPU."""

from __future__ import annotations

import random
import shutil

import pytest

from tuner.compile import compile_config
from tuner.devices import limits_for_arch
from tuner.problem import Problem
from tuner.space import config_key, load_space

pytestmark = [pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed"), pytest.mark.slow]

# sm90: each scheduling/pipeline knob away from its default, and their combinations that share code paths
SM90_REPRESENTATIVE = {
    "default": {},
    "persistent": {"persistent": 1},
    "cluster": {"cta_mode": 2, "scheduler": 0, "producer_regs": 32, "consumer_regs": 232},
    "cluster_persistent": {"cta_mode": 2, "scheduler": 0, "persistent": 1, "producer_regs": 32, "consumer_regs": 232},
    "pv_split": {"intra_wg_overlap": 0, "pv_split": 64},
    "pv_split_pingpong_persistent": {
        "intra_wg_overlap": 0,
        "pv_split": 32,
        "pingpong": 1,
        "persistent": 1,
        "block_n": 112,
    },
    "pingpong": {"pingpong": 1},
    "poly_exp": {"poly_exp": 2},
    "poly_exp_serial_pv_split": {"poly_exp": 4, "intra_wg_overlap": 0, "pv_split": 64},
    "pingpong_persistent": {"pingpong": 1, "persistent": 1},
    "three_wgs_pingpong_persistent": {
        "consumer_wgs": 3,
        "producer_regs": 32,
        "consumer_regs": 160,
        "block_n": 64,
        "pingpong": 1,
        "persistent": 1,
    },
    "three_wgs_cluster": {
        "consumer_wgs": 3,
        "producer_regs": 32,
        "consumer_regs": 160,
        "block_n": 64,
        "cta_mode": 2,
        "scheduler": 0,
        "persistent": 1,
    },
    "one_wg": {"consumer_wgs": 1, "producer_regs": 56, "consumer_regs": 256, "block_n": 176, "kv_stages": 2},
    "shared_kv_barriers": {"kv_barriers": 1},
    "shared_kv_barriers_serial_pingpong": {"kv_barriers": 1, "intra_wg_overlap": 0, "pingpong": 1},
    "shared_kv_barriers_cluster_persistent": {
        "kv_barriers": 1,
        "cta_mode": 2,
        "scheduler": 0,
        "persistent": 1,
        "producer_regs": 32,
        "consumer_regs": 232,
    },
    # two CTAs per SM: one consumer warpgroup each, registers and shared memory halved
    "two_ctas_per_sm": {"ctas_per_sm": 2, "consumer_wgs": 1, "producer_regs": 24, "consumer_regs": 232, "block_n": 64},
    "two_ctas_per_sm_persistent": {
        "ctas_per_sm": 2,
        "persistent": 1,
        "consumer_wgs": 1,
        "producer_regs": 24,
        "consumer_regs": 232,
        "block_n": 64,
    },
    "two_ctas_per_sm_cluster_serial": {
        "ctas_per_sm": 2,
        "cta_mode": 2,
        "scheduler": 0,
        "consumer_wgs": 1,
        "producer_regs": 32,
        "consumer_regs": 224,
        "block_n": 64,
        "intra_wg_overlap": 0,
    },
    # the dynamic scheduler (units from the tile counter): alone, with the turn chain and the serial loop on one
    # K/V barrier pair, and two CTAs per SM
    "dynamic": {"scheduler": 1},
    "dynamic_pingpong_serial_shared_kv_barriers": {
        "scheduler": 1,
        "pingpong": 1,
        "intra_wg_overlap": 0,
        "kv_barriers": 1,
    },
    "dynamic_two_ctas_per_sm": {
        "ctas_per_sm": 2,
        "persistent": 1,
        "consumer_wgs": 1,
        "producer_regs": 24,
        "consumer_regs": 232,
        "block_n": 64,
        "scheduler": 1,
    },
    # one Q stage in a persistent CTA (the stage handed back in each epilogue, K/V loaded ahead of Q): FA3's
    # 128 x 176 tile, whose second Q stage does not fit at head dim 128; with the dynamic scheduler; in a cluster
    # with the serial loop on one K/V barrier pair and ping-pong
    "one_q_stage_fa3_tile": {
        "block_n": 176,
        "consumer_wgs": 2,
        "kv_stages": 2,
        "persistent": 1,
        "q_stages": 1,
        "producer_regs": 24,
        "consumer_regs": 240,
    },
    "one_q_stage_dynamic": {"persistent": 1, "q_stages": 1, "scheduler": 1},
    "one_q_stage_cluster_serial_shared_kv_barriers_pingpong": {
        "persistent": 1,
        "q_stages": 1,
        "consumer_wgs": 2,
        "cta_mode": 2,
        "scheduler": 0,
        "producer_regs": 32,
        "consumer_regs": 232,
        "intra_wg_overlap": 0,
        "kv_barriers": 1,
        "pingpong": 1,
    },
    # split-KV (the partials' stores and the merge in the epilogue): with the dynamic scheduler (the default), one
    # CTA per block, a persistent cluster with the serial loop, ping-pong with one Q stage, two CTAs per SM
    "split2": {"kv_splits": 2},
    "split3_one_per_block": {"kv_splits": 3, "persistent": 0, "scheduler": 0},
    "split4_cluster_persistent_serial": {
        "kv_splits": 4,
        "cta_mode": 2,
        "scheduler": 0,
        "persistent": 1,
        "producer_regs": 32,
        "consumer_regs": 232,
        "intra_wg_overlap": 0,
    },
    "split6_pingpong_one_q_stage": {"kv_splits": 6, "pingpong": 1, "persistent": 1, "q_stages": 1},
    "split8_two_ctas_per_sm": {
        "kv_splits": 8,
        "ctas_per_sm": 2,
        "consumer_wgs": 1,
        "producer_regs": 24,
        "consumer_regs": 232,
        "block_n": 64,
    },
}
# sm90 at head dim 64 only: tiles whose registers or shared memory do not fit larger head dims
SM90_D64_REPRESENTATIVE = {
    "d64_three_wgs_bn128": {"consumer_wgs": 3, "producer_regs": 32, "consumer_regs": 160, "block_n": 128},
    "d64_three_wgs_serial_bn160_persistent": {
        "consumer_wgs": 3,
        "producer_regs": 32,
        "consumer_regs": 160,
        "block_n": 160,
        "intra_wg_overlap": 0,
        "persistent": 1,
    },
    "d64_three_wgs_serial_bn160_dynamic": {
        "consumer_wgs": 3,
        "producer_regs": 32,
        "consumer_regs": 160,
        "block_n": 160,
        "intra_wg_overlap": 0,
        "persistent": 1,
        "scheduler": 1,
    },
    "d64_three_wgs_serial_bn160_dynamic_split3": {  # the serial loop's 28 spare registers, and the merge
        "consumer_wgs": 3,
        "producer_regs": 32,
        "consumer_regs": 160,
        "block_n": 160,
        "intra_wg_overlap": 0,
        "persistent": 1,
        "scheduler": 1,
        "kv_splits": 3,
    },
    "d64_two_ctas_per_sm_bn128_poly_exp": {
        "ctas_per_sm": 2,
        "consumer_wgs": 1,
        "producer_regs": 24,
        "consumer_regs": 232,
        "block_n": 128,
        "poly_exp": 2,
    },
    "d64_two_ctas_per_sm_persistent_bn176": {
        "ctas_per_sm": 2,
        "persistent": 1,
        "consumer_wgs": 1,
        "producer_regs": 24,
        "consumer_regs": 232,
        "block_n": 176,
    },
}
# sm90 at head dim 256 (its default has block_n 80): the code paths that still fit beside a 64 KB Q tile
SM90_D256_REPRESENTATIVE = {
    "d256_default": {},
    "d256_block_n_64_pingpong": {"block_n": 64, "pingpong": 1},
    "d256_serial_pv_split": {"intra_wg_overlap": 0, "pv_split": 32},
    "d256_cluster": {"cta_mode": 2, "scheduler": 0, "producer_regs": 32, "consumer_regs": 232},
    "d256_one_wg_persistent": {
        "consumer_wgs": 1,
        "producer_regs": 56,
        "consumer_regs": 256,
        "block_n": 64,
        "persistent": 1,
    },
    "d256_shared_kv_barriers_cluster": {
        "kv_barriers": 1,
        "cta_mode": 2,
        "scheduler": 0,
        "producer_regs": 32,
        "consumer_regs": 232,
    },
    "d256_persistent_one_q_stage": {"persistent": 1, "q_stages": 1},  # two Q stages do not fit at d256
    "d256_split4": {"kv_splits": 4},
    "d256_persistent_one_q_stage_split2": {"persistent": 1, "q_stages": 1, "kv_splits": 2},
    "d256_one_wg_dynamic": {
        "consumer_wgs": 1,
        "producer_regs": 56,
        "consumer_regs": 256,
        "block_n": 64,
        "persistent": 1,
        "scheduler": 1,
    },
}
#: family -> named partial configs that the GPU correctness matrix also runs (tests/gpu/test_correctness.py),
#: at every head dim where they are feasible (missing knobs: that head dim's defaults)
REPRESENTATIVE = {"sm90": {**SM90_REPRESENTATIVE, **SM90_D64_REPRESENTATIVE, **SM90_D256_REPRESENTATIVE}}


def _problem(head_dim: int, dtype: str, causal: bool) -> Problem:
    return Problem(batch=1, seqlen_q=128, heads_q=1, head_dim=head_dim, dtype=dtype, causal=causal)


@pytest.mark.parametrize("name", list(SM90_REPRESENTATIVE))
@pytest.mark.parametrize(("head_dim", "dtype", "causal"), [(128, "fp16", False), (64, "bf16", True)])
def test_sm90_representative_configs_build_without_spills(name, head_dim, dtype, causal):
    space = load_space("sm90")
    device = limits_for_arch(90)
    config = space.validate(SM90_REPRESENTATIVE[name], partial=True)
    problem = _problem(head_dim, dtype, causal)
    assert space.check(config, problem, device) is None
    kernel = compile_config(space, config, problem, device)
    assert kernel.arch == "90a"
    assert not kernel.resources.spills, (name, kernel.resources)


@pytest.mark.parametrize("name", list(SM90_D64_REPRESENTATIVE))
@pytest.mark.parametrize(("dtype", "causal"), [("fp16", False), ("bf16", True)])
def test_sm90_head_dim_64_configs_build_without_spills(name, dtype, causal):
    space = load_space("sm90")
    device = limits_for_arch(90)
    config = space.validate(SM90_D64_REPRESENTATIVE[name], partial=True, head_dim=64)
    problem = _problem(64, dtype, causal)
    assert space.check(config, problem, device) is None
    assert space.check(config, _problem(128, dtype, causal), device) is not None  # else it belongs above
    kernel = compile_config(space, config, problem, device)
    assert not kernel.resources.spills, (name, kernel.resources)


@pytest.mark.parametrize("name", list(SM90_D256_REPRESENTATIVE))
@pytest.mark.parametrize(("dtype", "causal"), [("fp16", False), ("bf16", True)])
def test_sm90_head_dim_256_configs_build_without_spills(name, dtype, causal):
    space = load_space("sm90")
    device = limits_for_arch(90)
    config = space.validate(SM90_D256_REPRESENTATIVE[name], partial=True, head_dim=256)
    problem = _problem(256, dtype, causal)
    assert space.check(config, problem, device) is None
    kernel = compile_config(space, config, problem, device)
    assert not kernel.resources.spills, (name, kernel.resources)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_sm90_every_kv_splits_value_builds_without_spills(head_dim):
    """Each kv_splits value with the head dim's defaults (the d64 default, three consumer warpgroups at 160
    registers, has no register to spare: the merge once spilled there), causal (the split's first block bound in
    the causal skip) and not."""
    space = load_space("sm90")
    device = limits_for_arch(90)
    for splits in space.knob("kv_splits").values:
        config = {**space.defaults(head_dim), "kv_splits": splits}
        for causal, dtype in ((False, "fp16"), (True, "bf16")):
            problem = _problem(head_dim, dtype, causal)
            assert space.check(config, problem, device) is None
            kernel = compile_config(space, config, problem, device)
            assert not kernel.resources.spills, (splits, problem.slug(), kernel.resources)


@pytest.mark.parametrize("family", ["sm80", "sm90"])
def test_sampled_feasible_configs_build_without_spills(family):
    space = load_space(family)
    arch = space.family.min_arch if space.family.arch_suffix else 80
    device = limits_for_arch(arch)
    rng = random.Random(20261129)
    built: dict[str, object] = {}
    while len(built) < 6:
        problem = _problem(rng.choice(space.family.head_dims), rng.choice(space.family.dtypes), rng.random() < 0.5)
        config = {k.name: rng.choice(k.values) for k in space.knobs}
        if space.check(config, problem, device) is None:
            kernel = compile_config(space, config, problem, device)
            built[config_key(config) + repr(problem)] = kernel.resources
            assert not kernel.resources.spills, (config, problem, kernel.resources)
    assert len(built) == 6
