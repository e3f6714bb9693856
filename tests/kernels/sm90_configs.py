"""Named partial configs of sm90 that the kernel tests build: each scheduling and pipeline knob away from its
default, and their combinations that share code paths. The knobs left out are completed for the problem
(:func:`complete`: the defaults, or where those cannot run beside the given knobs, the nearest that do; a
2-CTA cluster or one CTA per block thus takes the static scheduler). tests/kernels/test_kernel_builds.py builds
them without spills, tests/kernels/test_kernel_schedule.py checks the work distribution of those that schedule
differently, and tests/gpu/test_correctness.py runs them on a GPU."""

from __future__ import annotations

# the register budgets that a shape of CTA needs (setmaxnreg: producer + consumers within the entry budget)
CLUSTER = {"cta_mode": 2, "producer_regs": 32, "consumer_regs": 232}  # the producer of a cluster needs 32
THREE_WGS = {"consumer_wgs": 3, "producer_regs": 32, "consumer_regs": 160}
ONE_WG = {"consumer_wgs": 1, "producer_regs": 56, "consumer_regs": 256}
TWO_CTAS_PER_SM = {"ctas_per_sm": 2, "consumer_wgs": 1, "producer_regs": 24, "consumer_regs": 232}

# sm90: each scheduling/pipeline knob away from its default, and their combinations that share code paths
SM90_REPRESENTATIVE = {
    "default": {},
    "persistent": {"persistent": 1},
    "cluster": CLUSTER,
    "cluster_persistent": {**CLUSTER, "persistent": 1},
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
    "three_wgs_pingpong_persistent": {**THREE_WGS, "block_n": 64, "pingpong": 1, "persistent": 1},
    "three_wgs_cluster": {**THREE_WGS, "block_n": 64, "cta_mode": 2, "persistent": 1},
    "one_wg": {**ONE_WG, "block_n": 176, "kv_stages": 2},
    "shared_kv_barriers": {"kv_barriers": 1},
    "shared_kv_barriers_serial_pingpong": {"kv_barriers": 1, "intra_wg_overlap": 0, "pingpong": 1},
    "shared_kv_barriers_cluster_persistent": {**CLUSTER, "kv_barriers": 1, "persistent": 1},
    # two CTAs per SM: one consumer warpgroup each, registers and shared memory halved
    "two_ctas_per_sm": {**TWO_CTAS_PER_SM, "block_n": 64},
    "two_ctas_per_sm_persistent": {**TWO_CTAS_PER_SM, "block_n": 64, "persistent": 1},
    "two_ctas_per_sm_cluster_serial": {
        **TWO_CTAS_PER_SM,
        "cta_mode": 2,
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
    "dynamic_two_ctas_per_sm": {**TWO_CTAS_PER_SM, "block_n": 64, "persistent": 1, "scheduler": 1},
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
        **CLUSTER,
        "persistent": 1,
        "q_stages": 1,
        "consumer_wgs": 2,
        "intra_wg_overlap": 0,
        "kv_barriers": 1,
        "pingpong": 1,
    },
    # split-KV (the partials' stores and the merge in the epilogue): with the dynamic scheduler (the default), one
    # CTA per block, a persistent cluster with the serial loop, ping-pong with one Q stage, two CTAs per SM
    "split2": {"kv_splits": 2},
    "split3_one_per_block": {"kv_splits": 3, "persistent": 0},
    "split4_cluster_persistent_serial": {**CLUSTER, "kv_splits": 4, "persistent": 1, "intra_wg_overlap": 0},
    "split6_pingpong_one_q_stage": {"kv_splits": 6, "pingpong": 1, "persistent": 1, "q_stages": 1},
    "split8_two_ctas_per_sm": {**TWO_CTAS_PER_SM, "kv_splits": 8, "block_n": 64},
    # the tail split (the last wave's tiles split at run time, merged as split-KV's): with the dynamic scheduler
    # (the default), the static snake, a persistent cluster with the serial loop, two CTAs per SM with ping-pong's
    # absence and one Q stage; tests/gpu/test_correctness.py runs them also on shapes where the split is active
    "tail2": {"tail_splits": 2},
    "tail3_static_snake": {"tail_splits": 3, "scheduler": 0},
    "tail2_cluster_persistent": {**CLUSTER, "tail_splits": 2, "persistent": 1, "intra_wg_overlap": 0},
    "tail4_two_ctas_per_sm": {**TWO_CTAS_PER_SM, "tail_splits": 4, "block_n": 64, "persistent": 1, "q_stages": 1},
    "tail4_three_wgs_pingpong": {**THREE_WGS, "block_n": 64, "pingpong": 1, "persistent": 1, "tail_splits": 4},
    # P through shared memory (wgmma ss for O += P V): the overlapped loop, the serial one with ping-pong, the
    # dynamic scheduler in a persistent CTA, a cluster
    "p_smem": {"p_smem": 1},
    "p_smem_serial_pingpong": {"p_smem": 1, "intra_wg_overlap": 0, "pingpong": 1},
    "p_smem_dynamic": {"p_smem": 1, "persistent": 1, "scheduler": 1},
    "p_smem_cluster_serial": {**CLUSTER, "p_smem": 1, "intra_wg_overlap": 0},
    # intra_wg_overlap 2 (the exponentials beside the previous block's P.V; the d64 default) and 1 (after its wait,
    # the default at d128 and d256), with P in registers or in shared memory, ping-pong
    "overlap_exp_after": {"intra_wg_overlap": 1},
    "overlap_exp_beside": {"intra_wg_overlap": 2},
    "overlap_exp_beside_pingpong": {"intra_wg_overlap": 2, "pingpong": 1},
    "overlap_exp_beside_p_smem_bn112": {"intra_wg_overlap": 2, "p_smem": 1, "block_n": 112},
}
# sm90 at head dim 64 only: tiles whose registers or shared memory do not fit larger head dims
SM90_D64_REPRESENTATIVE = {
    "d64_three_wgs_bn128": {**THREE_WGS, "block_n": 128},
    "d64_three_wgs_bn128_exp_after": {**THREE_WGS, "block_n": 128, "intra_wg_overlap": 1},
    "d64_three_wgs_serial_bn160_persistent": {**THREE_WGS, "block_n": 160, "intra_wg_overlap": 0, "persistent": 1},
    "d64_three_wgs_serial_bn160_dynamic": {
        **THREE_WGS,
        "block_n": 160,
        "intra_wg_overlap": 0,
        "persistent": 1,
        "scheduler": 1,
    },
    "d64_three_wgs_serial_bn160_dynamic_split3": {  # the serial loop's 28 spare registers, and the merge
        **THREE_WGS,
        "block_n": 160,
        "intra_wg_overlap": 0,
        "persistent": 1,
        "scheduler": 1,
        "kv_splits": 3,
    },
    "d64_three_wgs_serial_bn160_dynamic_tail3": {  # the same with the tail split's run-time count
        **THREE_WGS,
        "block_n": 160,
        "intra_wg_overlap": 0,
        "persistent": 1,
        "scheduler": 1,
        "tail_splits": 3,
    },
    # the [[defaults]] rules' tiles for non-causal d64 problems of few waves: 2 warpgroups of 240 registers, 176 or
    # 192 keys
    **{
        f"d64_two_wgs_bn{n}_dynamic": {
            "consumer_wgs": 2,
            "producer_regs": 24,
            "consumer_regs": 240,
            "block_n": n,
            "persistent": 1,
            "scheduler": 1,
        }
        for n in (176, 192)
    },
    "d64_two_ctas_per_sm_bn128_poly_exp": {**TWO_CTAS_PER_SM, "block_n": 128, "poly_exp": 2},
    "d64_two_ctas_per_sm_persistent_bn176": {**TWO_CTAS_PER_SM, "block_n": 176, "persistent": 1},
    # p_smem: FA3's 192 x 192 tile (serial loop: no P registers), with the dynamic scheduler; 176 keys (a padded
    # P panel) with ping-pong; the overlapped loop's widest spill-free tile of 3 warpgroups (144 keys)
    "d64_p_smem_fa3_tile": {**THREE_WGS, "block_n": 192, "intra_wg_overlap": 0, "p_smem": 1},
    "d64_p_smem_fa3_tile_dynamic": {
        **THREE_WGS,
        "block_n": 192,
        "intra_wg_overlap": 0,
        "p_smem": 1,
        "persistent": 1,
        "scheduler": 1,
    },
    "d64_p_smem_three_wgs_bn176_serial_pingpong": {
        **THREE_WGS,
        "block_n": 176,
        "intra_wg_overlap": 0,
        "pingpong": 1,
        "p_smem": 1,
    },
    "d64_p_smem_three_wgs_bn144_overlapped": {**THREE_WGS, "block_n": 144, "p_smem": 1},
    "d64_p_smem_three_wgs_serial_bn176_dynamic_split3": {  # the widest p_smem tile beside the merge
        **THREE_WGS,
        "block_n": 176,
        "intra_wg_overlap": 0,
        "p_smem": 1,
        "persistent": 1,
        "scheduler": 1,
        "kv_splits": 3,
    },
}
# sm90 at head dim 256 (its default has block_n 80): the code paths that still fit beside a 64 KB Q tile
SM90_D256_REPRESENTATIVE = {
    "d256_default": {},
    "d256_block_n_64_pingpong": {"block_n": 64, "pingpong": 1},
    "d256_serial_pv_split": {"intra_wg_overlap": 0, "pv_split": 32},
    "d256_cluster": CLUSTER,
    "d256_one_wg_persistent": {**ONE_WG, "block_n": 64, "persistent": 1},
    "d256_shared_kv_barriers_cluster": {**CLUSTER, "kv_barriers": 1},
    "d256_persistent_one_q_stage": {"persistent": 1, "q_stages": 1},  # two Q stages do not fit at d256
    "d256_split4": {"kv_splits": 4},
    "d256_persistent_one_q_stage_split2": {"persistent": 1, "q_stages": 1, "kv_splits": 2},
    "d256_persistent_one_q_stage_tail4": {"persistent": 1, "q_stages": 1, "tail_splits": 4},
    "d256_one_wg_dynamic": {**ONE_WG, "block_n": 64, "persistent": 1, "scheduler": 1},
    # the non-causal few-keys default: the persistent one-Q-stage tile, dynamic, with ping-pong
    "d256_tile_dynamic_pingpong": {"block_n": 64, "pingpong": 1, "persistent": 1, "q_stages": 1, "scheduler": 1},
    "d256_p_smem_block_n_64": {"block_n": 64, "p_smem": 1},  # 80 keys' P tiles do not fit beside the rings
}
# sm90 for causal problems only (unit_order > 0 orders causal units by length): sections with the dynamic order, one
# CTA per block, the static snake in a cluster (its producer takes 40 registers: at a cluster's 32 the sections' unit
# arithmetic spills 16 B, ptxas 13.0) and split-KV; the last section alone, dynamic and one CTA per block;
# the d256 tile persistent with one Q stage, 64-key blocks and the last section (dynamic)
SM90_CAUSAL_REPRESENTATIVE = {
    "sections": {"unit_order": 1},
    "sections_one_per_block": {"unit_order": 1, "persistent": 0},
    "sections_static_snake_cluster": {**CLUSTER, "producer_regs": 40, "unit_order": 1, "persistent": 1},
    "sections_split2": {"unit_order": 1, "kv_splits": 2},
    "last_section": {"unit_order": 2},
    "last_section_one_per_block": {"unit_order": 2, "persistent": 0},
    "last_section_one_q_stage_bn64": {"unit_order": 2, "persistent": 1, "q_stages": 1, "block_n": 64, "scheduler": 1},
}
#: family -> named partial configs that the GPU correctness matrix also runs (tests/gpu/test_correctness.py),
#: at every head dim where they are feasible (missing knobs: that head dim's defaults)
REPRESENTATIVE = {
    "sm90": {
        **SM90_REPRESENTATIVE,
        **SM90_D64_REPRESENTATIVE,
        **SM90_D256_REPRESENTATIVE,
        **SM90_CAUSAL_REPRESENTATIVE,
    }
}
