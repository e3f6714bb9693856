"""tuner.devices: the nominal limits table and limits from what a GPU worker reports."""

from __future__ import annotations

import pytest

from tuner.devices import DEVICE_MACROS, KNOWN_ARCHS, SMEM_RESERVED_PER_BLOCK, DeviceLimits, limits_for_arch
from tuner.problem import Problem
from tuner.space import complete, load_space

H200 = {"name": "NVIDIA H200", "arch": 90, "num_sms": 132, "smem_per_block_optin": 232448, "regs_per_sm": 65536}


@pytest.mark.parametrize("arch", KNOWN_ARCHS)
def test_one_cta_of_the_opt_in_maximum_and_its_reservation_fill_an_sm(arch):
    """The programming guide's figures: per SM = opt-in per block + the 1 KB reserved per block."""
    d = limits_for_arch(arch)
    assert d.smem_per_sm == d.smem_per_block_optin + d.smem_reserved_per_block
    assert d.env()["smem_per_sm"] == d.smem_per_sm and d.env()["smem_reserved_per_block"] == SMEM_RESERVED_PER_BLOCK


@pytest.mark.parametrize("arch", KNOWN_ARCHS)
def test_macros_are_the_limits_the_constraints_read(arch):
    """The compiler gets the same numbers as the space expressions (env), under FT_ names; not the SM count,
    so that one cubin serves every part of an arch."""
    d = limits_for_arch(arch)
    macros = d.macros()
    assert set(macros) == set(DEVICE_MACROS.values())
    assert all(macros[macro] == d.env()[name] for name, macro in DEVICE_MACROS.items())
    assert macros["FT_SMEM_PER_BLOCK_OPTIN"] == d.smem_per_block_optin and macros["FT_SMEM_PER_SM"] == d.smem_per_sm
    assert "num_sms" not in DEVICE_MACROS and "arch" not in DEVICE_MACROS
    other_part = DeviceLimits(arch=arch, smem_per_block_optin=d.smem_per_block_optin, num_sms=d.num_sms + 1)
    assert other_part.macros() == macros


def test_macros_follow_a_device_with_other_limits():
    d = DeviceLimits.from_info({**H200, "smem_per_block_optin": 200000, "smem_per_sm": 201024, "regs_per_sm": 32768})
    assert d.macros() == {
        "FT_SMEM_PER_BLOCK_OPTIN": 200000,
        "FT_SMEM_PER_SM": 201024,
        "FT_SMEM_RESERVED_PER_BLOCK": 1024,
        "FT_REGS_PER_SM": 32768,
        "FT_MAX_REGS_PER_THREAD": 255,
    }


def test_limits_from_a_device_report():
    d = DeviceLimits.from_info({**H200, "smem_per_sm": 233472, "smem_reserved_per_block": 1024})
    assert (d.smem_per_sm, d.smem_reserved_per_block, d.num_sms) == (233472, 1024, 132)


def test_a_report_stored_before_smem_per_sm_gets_the_table_value():
    assert DeviceLimits.from_info(H200).smem_per_sm == 233472
    # an arch the table does not know: room for exactly one CTA of the opt-in maximum
    old = DeviceLimits.from_info({**H200, "arch": 75, "smem_per_block_optin": 65536})
    assert old.smem_per_sm == 65536 + SMEM_RESERVED_PER_BLOCK


def test_two_ctas_per_sm_must_fit_the_sm_exactly():
    """sm90: two CTAs of one consumer warpgroup fit at 64 keys per tile (head dim 128), not at 96,
    whose two CTAs need 512 B more than the SM has."""
    space, device = load_space("sm90"), limits_for_arch(90)
    problem = Problem(batch=1, seqlen_q=128, heads_q=1, head_dim=128)
    config = {"ctas_per_sm": 2, "consumer_wgs": 1, "producer_regs": 24, "consumer_regs": 232, "persistent": 0}
    fits = complete(space, {**config, "block_n": 80}, problem, device).config
    assert space.check(fits, problem, device) is None
    too_big = {**fits, "block_n": 96}
    env = space.environment(too_big, problem, device)
    assert 2 * (env["smem_bytes"] + 1024) == device.smem_per_sm + 512
    assert "smem_per_sm_fits" in space.check(too_big, problem, device)
    assert (
        space.check({**too_big, "ctas_per_sm": 1, "producer_regs": 56, "consumer_regs": 256}, problem, device) is None
    )
    # and the registers: two CTAs of 256 threads start at 128 each, so producer + consumer <= 256
    assert env["entry_regs"] == 128
    assert "setmaxnreg_budget" in space.check({**fits, "producer_regs": 32}, problem, device)
