"""sm90's p_smem knob: P through a shared-memory tile per consumer warpgroup (wgmma ss for O += P V) frees P's
registers, so FA3's head-dim-64 tile (192 x 192, 3 consumer warpgroups of 160 registers, serial loop) is feasible
with it and refused without; the overlapped loop still keeps part of P's registers (ptxas: 144 keys fit, 160
spill); the P tiles count in shared memory; pv_split with p_smem is refused by the space file and by config.cuh
in the same words. nvcc for the header half; no GPU."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import compile_config_header
from tuner.devices import limits_for_arch
from tuner.problem import Problem
from tuner.space import load_space

H200 = limits_for_arch(90)
# FA3's d64 tiles: 3 consumer warpgroups of 160 registers, 2 K/V stages (the d64 default takes 3, which leave no room
# for the P tiles beside 192 keys)
THREE_WGS = {"consumer_wgs": 3, "producer_regs": 32, "consumer_regs": 160, "kv_stages": 2}


def _problem(head_dim: int = 64, causal: bool = False) -> Problem:
    return Problem(batch=4, seqlen_q=4096, heads_q=16, head_dim=head_dim, causal=causal)


@pytest.fixture(scope="module")
def space():
    return load_space("sm90")


def _config(space, head_dim: int = 64, **knobs) -> dict:
    return {**space.defaults(head_dim), **knobs}


def test_default_is_off_and_costs_nothing(space):
    for head_dim in (64, 128, 256):
        config = space.defaults(head_dim)
        assert config["p_smem"] == 0
        assert space.environment(config, _problem(head_dim), H200)["p_smem_bytes"] == 0


def test_fa3s_d64_tile_is_feasible_with_p_in_shared_memory(space):
    fa3 = _config(space, **THREE_WGS, block_n=192, intra_wg_overlap=0, p_smem=1)
    assert space.check(fa3, _problem(), H200) is None
    env = space.environment(fa3, _problem(), H200)
    assert env["p_smem_bytes"] == 3 * 64 * 192 * 2
    assert env["acc_regs"] == 96 + 32  # S and O: no P registers in the serial loop


def test_fa3s_d64_tile_without_p_smem_is_refused_with_the_way_out(space):
    reasons = space.violations(_config(space, **THREE_WGS, block_n=192, intra_wg_overlap=0), _problem(), H200)
    assert [r.split(":", 1)[0] for r in reasons] == ["consumer_registers"], reasons
    assert "p_smem 1" in reasons[0], reasons[0]


def test_the_overlapped_loop_keeps_part_of_ps_registers(space):
    def feasible(block_n):
        config = _config(space, **THREE_WGS, block_n=block_n, p_smem=1)
        return space.check(config, _problem(), H200) is None

    assert feasible(144) and not feasible(160)  # ptxas: 144 keys build spill-free, 160 spill


def test_p_tiles_count_in_shared_memory_padded_to_whole_panels(space):
    config = _config(space, **THREE_WGS, block_n=176, intra_wg_overlap=0, p_smem=1)
    env = space.environment(config, _problem(), H200)
    assert env["p_smem_bytes"] == 3 * 64 * 192 * 2
    assert env["smem_bytes"] == env["q_smem_bytes"] + env["kv_smem_bytes"] + env["p_smem_bytes"] + 1280
    # head dim 256's default 80-key tile: its P tiles do not fit beside the K/V ring
    reasons = space.violations(_config(space, 256, p_smem=1), _problem(256), H200)
    assert reasons and reasons[0].startswith("smem_fits"), reasons


def test_pv_split_with_p_smem_is_refused(space):
    config = _config(space, intra_wg_overlap=0, pv_split=64, p_smem=1)
    reasons = space.violations(config, _problem(), H200)
    assert [r.split(":", 1)[0] for r in reasons] == ["p_smem_pv_split"], reasons
    assert "set pv_split=0 or p_smem=0" in reasons[0]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_the_config_header_refuses_it_too(space, tmp_path):
    def build(cfg):
        return compile_config_header(space, space.build_macros(cfg, _problem(), H200), "90a", tmp_path)

    config = _config(space, intra_wg_overlap=0, pv_split=64, p_smem=1)
    refused = build(config)
    assert refused.returncode != 0 and "set pv_split=0 or p_smem=0" in refused.stderr, refused.stderr[-2000:]
    assert build({**config, "pv_split": 0}).returncode == 0


def test_a_split_merge_beside_fa3s_tile_is_refused(space):
    """ptxas spills 8 B building the 192-key serial tile with the split merge (kv_splits or tail_splits), none
    at 176 keys."""
    for split in ({"kv_splits": 3}, {"tail_splits": 3}):
        fa3 = _config(space, **THREE_WGS, block_n=192, intra_wg_overlap=0, p_smem=1, scheduler=1, **split)
        names = [r.split(":", 1)[0] for r in space.violations(fa3, _problem(), H200)]
        assert "consumer_registers" in names, names
        names = [r.split(":", 1)[0] for r in space.violations({**fa3, "block_n": 176}, _problem(), H200)]
        assert "consumer_registers" not in names, names
