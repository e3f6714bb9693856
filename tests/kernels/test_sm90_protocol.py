"""The sm90 kernel's barrier protocol under random timing (model: tests/kernels/sm90_protocol_model.py).

Producer, consumer warps, TMA loads and stores and wgmma groups of kernel_src/sm90 run as
agents that a seeded random scheduler interleaves; every read must see its tile, no tile may be
overwritten while read, every parity wait must ask about the phase it means, nothing may deadlock
and every O must be stored once. Covered: one unit per CTA and persistent CTAs (two Q stages,
the O store held over into the next unit; one Q stage, handed back at the end of each unit's
epilogue, the first K/V blocks loaded ahead of Q), 2-CTA clusters, ping-pong, both loops, pv_split,
kv_barriers 1 and 2, kv_stages 2 and 3, causal shapes whose units or warpgroups see no key, and the
dynamic scheduler (CTAs of one grid racing for units on one tile counter, each unit's id handed to the
consumers next to its Q stage, -1 to stop).
The planted faults show that the model catches what it claims to. Pure Python: no nvcc, no GPU.
"""

from __future__ import annotations

import pytest

from tests.kernels.sm90_protocol_model import (
    DYNAMIC_FAULTS,
    FAULTS,
    Knobs,
    ProtocolError,
    Shape,
    cluster_units,
    simulate,
)

CONFIGS = {
    "default": Knobs(),
    "serial_pv_split": Knobs(intra_wg_overlap=False, pv_split=True, block_n=64),
    "pingpong": Knobs(pingpong=True, block_n=64),
    "pingpong_serial_kv1": Knobs(pingpong=True, intra_wg_overlap=False, kv_barriers=1, block_n=64),
    "cluster": Knobs(cta_mode=2, block_n=64),
    "cluster_pingpong_serial": Knobs(cta_mode=2, pingpong=True, intra_wg_overlap=False, block_n=64),
    "persistent": Knobs(persistent=True, block_n=64),
    "persistent_serial_kv_stages_3": Knobs(persistent=True, intra_wg_overlap=False, kv_stages=3, block_n=64),
    "persistent_cluster": Knobs(persistent=True, cta_mode=2, block_n=64),
    "persistent_three_wgs_pingpong": Knobs(persistent=True, consumer_wgs=3, pingpong=True, block_n=64),
    "persistent_one_wg": Knobs(persistent=True, consumer_wgs=1, block_n=64),
    "persistent_cluster_kv1_serial_pv_split": Knobs(
        persistent=True, cta_mode=2, kv_barriers=1, intra_wg_overlap=False, pv_split=True, block_n=64
    ),
    "persistent_cluster_pingpong_kv1": Knobs(persistent=True, cta_mode=2, pingpong=True, kv_barriers=1, block_n=64),
    # one Q stage: released at the end of each unit's epilogue, the first K/V blocks loaded ahead of Q
    "one_q_stage": Knobs(persistent=True, q_stages=1, block_n=64),
    "one_q_stage_serial_kv_stages_3": Knobs(
        persistent=True, q_stages=1, intra_wg_overlap=False, kv_stages=3, block_n=64
    ),
    "one_q_stage_cluster_kv1": Knobs(persistent=True, q_stages=1, cta_mode=2, kv_barriers=1, block_n=64),
    "one_q_stage_three_wgs_pingpong": Knobs(persistent=True, q_stages=1, consumer_wgs=3, pingpong=True, block_n=64),
    "one_q_stage_one_wg_serial_pv_split": Knobs(
        persistent=True, q_stages=1, consumer_wgs=1, intra_wg_overlap=False, pv_split=True, block_n=64
    ),
    "dynamic": Knobs(persistent=True, scheduler=1, block_n=64),
    "dynamic_serial_kv1_kv_stages_3": Knobs(
        persistent=True, scheduler=1, intra_wg_overlap=False, kv_barriers=1, kv_stages=3, block_n=64
    ),
    "dynamic_three_wgs_pingpong": Knobs(persistent=True, scheduler=1, consumer_wgs=3, pingpong=True, block_n=64),
    "dynamic_one_wg_serial_pv_split": Knobs(
        persistent=True, scheduler=1, consumer_wgs=1, intra_wg_overlap=False, pv_split=True, block_n=64
    ),
    "dynamic_one_q_stage": Knobs(persistent=True, scheduler=1, q_stages=1, block_n=64),
    "dynamic_one_q_stage_serial_kv1_pingpong": Knobs(
        persistent=True, scheduler=1, q_stages=1, intra_wg_overlap=False, kv_barriers=1, pingpong=True, block_n=64
    ),
}

SHAPES = [  # tails and the diagonal; units and warpgroups that see no key (seqlen_q > seqlen_k, causal);
    # seqlen_k > seqlen_q; a single row; many small units per persistent CTA
    Shape(batch=1, seqlen_q=300, seqlen_k=300, heads_q=2, heads_kv=1, causal=True),
    Shape(batch=1, seqlen_q=700, seqlen_k=100, heads_q=2, heads_kv=2, causal=True),
    Shape(batch=2, seqlen_q=200, seqlen_k=457, heads_q=2, heads_kv=1, causal=False),
    Shape(batch=1, seqlen_q=200, seqlen_k=457, heads_q=1, heads_kv=1, causal=True),
    Shape(batch=1, seqlen_q=1, seqlen_k=1, heads_q=1, heads_kv=1, causal=False),
    Shape(batch=3, seqlen_q=130, seqlen_k=70, heads_q=2, heads_kv=1, causal=True),
]
SEEDS = range(3)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_protocol_holds_under_random_timing(name):
    knobs = CONFIGS[name]
    units = 0
    for shape in SHAPES:
        for seed in SEEDS:
            units += simulate(knobs, shape, seed=seed)
    assert units > 0


def test_persistent_ctas_take_several_units_and_some_see_no_key():
    """The shapes exercise what the persistent protocol must get right: CTAs looping over units,
    units without key blocks between units with them."""
    knobs = CONFIGS["persistent"]
    per_cta = cluster_units(knobs, SHAPES[1], clusters=2)
    assert len(per_cta) == 2 and all(len(u) >= 4 for u in per_cta)
    from tests.kernels.sm90_protocol_model import _unit

    kinds = {_unit(knobs, SHAPES[1], u, 0).n_block_max > 0 for u in per_cta[0]}
    assert kinds == {True, False}


#: the faults of one Q stage (the others are planted with two, and those of the stage's handback with one too)
ONE_Q_STAGE_FAULTS = frozenset({"one_q_stage_held_over", "kv_ahead_past_ring"})
# fault -> the knobs it needs (a persistent CTA; kv_barriers = 1 for the shared-barrier faults; the dynamic
# scheduler for its own; one Q stage for its own)
FAULT_KNOBS = {
    name: Knobs(
        persistent=True,
        block_n=64,
        kv_barriers=1 if name.startswith("kv1") else 2,
        scheduler=int(name in DYNAMIC_FAULTS),
        q_stages=1 if name in ONE_Q_STAGE_FAULTS else 2,
        faults=frozenset([name]),
    )
    for name in FAULTS
}
FAULT_CASES = (
    [(name, knobs) for name, knobs in FAULT_KNOBS.items()]
    + [
        (f"{name}@one_q_stage", Knobs(persistent=True, block_n=64, q_stages=1, faults=frozenset([name])))
        # not no_store_drain: with one stage every unit's epilogue has waited for its store's read
        for name in ("release_before_store_read", "skip_without_wait")
    ]
    + [
        (
            "one_q_stage_held_over@dynamic",
            Knobs(persistent=True, block_n=64, q_stages=1, scheduler=1, faults=frozenset(["one_q_stage_held_over"])),
        )
    ]
)


FAULT_SEEDS = 40  # random timings tried per shape before a planted fault counts as missed


@pytest.mark.parametrize(("case", "knobs"), FAULT_CASES, ids=[c for c, _ in FAULT_CASES])
def test_a_planted_fault_is_caught(case, knobs):
    """Under random timings, within FAULT_SEEDS seeds on the first three shapes (the first run that catches it
    ends the search): a race shows only in some interleavings (sentinel_without_wait in 4 of 30 seeds of one
    shape, since warpgroups of padding rows skip their key blocks and finish early)."""
    for seed in range(FAULT_SEEDS):
        for shape in SHAPES[:3]:
            try:
                simulate(knobs, shape, seed=seed)
            except ProtocolError:
                return
    fault = case.split("@")[0]
    pytest.fail(f"the model misses the fault {fault!r} ({case}): {FAULTS[fault]}")


def test_an_ambiguous_parity_wait_is_an_error():
    from tests.kernels.sm90_protocol_model import MBarrier

    class Alive:
        def check_alive(self, what):
            pass

    bar = MBarrier("b", 1, Alive())
    assert bar.passed(-1) and not bar.passed(0)
    bar.arrive()
    bar.arrive()  # two phases completed: a wait for phase 0 would read parity 0 as "not yet"
    with pytest.raises(ProtocolError, match="parity"):
        bar.passed(0)


@pytest.mark.parametrize("clusters", [4, 8, 12, 132])
def test_persistent_clusters_share_causal_work_evenly(clusters):
    """The snake order of tile_scheduler.cuh: when the cluster count is a multiple of the query blocks per
    head (132 SMs, 4 blocks of 128 rows at N = 512), plain round-robin gave each cluster units of one
    length; the snake gives each cluster a long and a short one in turn."""
    from tests.kernels.sm90_protocol_model import _unit

    knobs = Knobs(persistent=True)
    shape = Shape(batch=32, seqlen_q=512, seqlen_k=512, heads_q=16, heads_kv=16, causal=True)
    per_cluster = [
        sum(_unit(knobs, shape, u, 0).n_block_max for u in units) for units in cluster_units(knobs, shape, clusters)
    ]
    longest = max(_unit(knobs, shape, u, 0).n_block_max for u in range(4))
    assert max(per_cluster) - min(per_cluster) <= longest  # within one unit of each other
    round_robin = [
        sum(_unit(knobs, shape, u, 0).n_block_max for u in range(c, 2048, clusters)) for c in range(clusters)
    ]
    assert max(round_robin) >= 3 * min(round_robin)  # what the snake replaced


@pytest.mark.parametrize("ctas", [1, 2, 3, 5])
def test_dynamic_ctas_race_for_the_units(ctas):
    """The dynamic scheduler with 1 to 5 CTAs on one counter: under random timing the CTAs take different units
    from run to run (so the handoff is checked for many orders), each run takes every unit once (simulate checks
    that, and the zeroed counter)."""
    import random

    from tests.kernels.sm90_protocol_model import Model, Shape, TileCounter, total_units

    knobs = CONFIGS["dynamic"]
    # 6 units per head of 5, 3, 1 and no key blocks (3 of them), so that a CTA's next fetch depends on the timing
    shape = Shape(batch=1, seqlen_q=700, seqlen_k=300, heads_q=2, heads_kv=2, causal=True)
    assert total_units(knobs, shape) == 12
    orders = set()
    for seed in range(8):
        assert simulate(knobs, shape, seed=seed, clusters=ctas) == 12

    for seed in range(8):  # the units CTA 0 took, seed by seed
        rng, counter, agents = random.Random(seed), TileCounter(), []
        models = [
            Model(knobs, shape, [], rng, agents=agents, counter=counter, cluster=c, grid=ctas) for c in range(ctas)
        ]
        for m in models:
            m.start()
        models[0].run()
        orders.add(tuple(u.index for u in models[0].ctas[0].units))
    assert len(orders) > (1 if ctas > 1 else 0), orders
