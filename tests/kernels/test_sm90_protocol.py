"""The sm90 kernel's barrier protocol under random timing (model: tests/kernels/sm90_protocol_model.py).

Producer, consumer warps, TMA loads and stores and wgmma groups of kernel_src/sm90 run as
agents that a seeded random scheduler interleaves; every read must see its tile, no tile may be
overwritten while read, every parity wait must ask about the phase it means, nothing may deadlock
and every O must be stored once. Covered: one unit per CTA and persistent CTAs (two Q stages,
the O store held over into the next unit; one Q stage, handed back at the end of each unit's
epilogue, the first K/V blocks loaded ahead of Q), 2-CTA clusters, ping-pong, both loops, pv_split,
kv_barriers 1 and 2, kv_stages 2 and 3, causal shapes whose units or warpgroups see no key, and the
dynamic scheduler (CTAs of one grid racing for units on one tile counter, each unit's id handed to the
consumers next to its Q stage, -1 to stop), and unit_overlap (each unit's last P.V issued with the next unit's
first S GEMM, the unit's epilogue after them; 2: its producer issuing the next unit's Q early).
The planted faults show that the model catches what it claims to. Pure Python: no nvcc, no GPU.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest

from tests.kernels.sm90_protocol_model import (
    DYNAMIC_FAULTS,
    FAULTS,
    UNIT_OVERLAP_FAULTS,
    Knobs,
    ProtocolError,
    Shape,
    TileCounter,
    _unit,
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


def _overlap(**knobs) -> Knobs:
    return Knobs(persistent=True, unit_overlap=True, block_n=64, **knobs)


#: unit_overlap (persistent, q_stages = 2, the overlapped loop, no ping-pong): both schedulers, clusters, kv_stages
#: 2 to 4, kv_barriers 1 and 2, one to three consumer warpgroups, and its early-Q producer (unit_overlap = 2)
OVERLAP_CONFIGS = {
    "overlap": _overlap(),
    "overlap_kv1": _overlap(kv_barriers=1),
    "overlap_kv1_kv_stages_3": _overlap(kv_barriers=1, kv_stages=3),
    "overlap_kv_stages_4_three_wgs": _overlap(kv_stages=4, consumer_wgs=3),
    "overlap_one_wg_kv1": _overlap(consumer_wgs=1, kv_barriers=1),
    "overlap_block_n_128": Knobs(persistent=True, unit_overlap=True),
    "overlap_cluster": _overlap(cta_mode=2),
    "overlap_cluster_kv1_kv_stages_3": _overlap(cta_mode=2, kv_barriers=1, kv_stages=3),
    "overlap_cluster_three_wgs_kv1": _overlap(cta_mode=2, consumer_wgs=3, kv_barriers=1),
    "overlap_dynamic": _overlap(scheduler=1),
    "overlap_dynamic_kv1_kv_stages_3": _overlap(scheduler=1, kv_barriers=1, kv_stages=3),
    "overlap_dynamic_three_wgs_kv_stages_4": _overlap(scheduler=1, consumer_wgs=3, kv_stages=4),
    "early_q": _overlap(early_q=True),
    "early_q_cluster_kv1": _overlap(early_q=True, cta_mode=2, kv_barriers=1),
    "early_q_dynamic_three_wgs": _overlap(early_q=True, scheduler=1, consumer_wgs=3),
    "early_q_dynamic_one_wg_kv1_kv_stages_3": _overlap(
        early_q=True, scheduler=1, consumer_wgs=1, kv_barriers=1, kv_stages=3
    ),
}
OVERLAP_SHAPES = [  # besides SHAPES: many units of one key block each, with a warpgroup of padding rows; many units
    # of several key blocks whose warpgroups skip some or see none (seqlen_k < seqlen_q) or skip one (seqlen_k > seqlen_q)
    Shape(batch=2, seqlen_q=300, seqlen_k=60, heads_q=2, heads_kv=1, causal=False),
    Shape(batch=2, seqlen_q=512, seqlen_k=384, heads_q=2, heads_kv=1, causal=True),
    Shape(batch=1, seqlen_q=384, seqlen_k=448, heads_q=3, heads_kv=1, causal=True),
]
OVERLAP_SEEDS = range(8)  # seed s runs a grid of 2 + s % 2 CTAs (clusters): other units follow each other


@pytest.mark.parametrize("name", list(CONFIGS))
def test_protocol_holds_under_random_timing(name):
    knobs = CONFIGS[name]
    units = 0
    for shape in SHAPES:
        for seed in SEEDS:
            units += simulate(knobs, shape, seed=seed)
    assert units > 0


@pytest.mark.parametrize("name", list(OVERLAP_CONFIGS))
def test_unit_overlap_holds_under_random_timing(name):
    knobs = OVERLAP_CONFIGS[name]
    for shape in SHAPES + OVERLAP_SHAPES:
        for seed in OVERLAP_SEEDS:
            assert simulate(knobs, shape, seed=seed, clusters=2 + seed % 2) > 0


def _compute_end(shape: Shape, unit, wg: int) -> int:
    """Consumer::compute_end: one past the last key block warpgroup wg computes in the unit (0: none)."""
    first_row = unit.first_row0 + wg * 64
    return unit.visible(first_row) if unit.has_rows(first_row, shape.seqlen_q) else 0


def _steps(knobs: Knobs, shape: Shape, clusters: int) -> set[str]:
    """What the units of each CTA make the unit_overlap loop of each warpgroup do between a unit in which it
    computes a key block and the next one (Consumer::can_step_into)."""
    seen = set()
    for units in cluster_units(knobs, shape, clusters):
        for rank in range(knobs.cta_mode):
            chain = [_unit(knobs, shape, u, rank) for u in units]
            for unit, nxt in itertools.pairwise(chain):
                for wg in range(knobs.consumer_wgs):
                    if _compute_end(shape, unit, wg) == 0:
                        continue  # nothing pending: no step
                    end = _compute_end(shape, nxt, wg)
                    if nxt.n_block_max == 0:
                        seen.add("next unit without key blocks")
                    elif end == 0:
                        seen.add("next unit's rows of the warpgroup see no key")
                    elif end < nxt.n_block_max:
                        seen.add("next unit's first blocks skipped")
                    else:
                        seen.add("step into one key block" if nxt.n_block_max == 1 else "step")
    return seen


@pytest.mark.parametrize("name", ["overlap", "overlap_cluster", "overlap_kv_stages_4_three_wgs"])
def test_unit_overlap_shapes_step_and_do_not(name):
    """The shapes take every branch of the step: carried units of one key block and of several, and units that
    cannot be stepped into (no key blocks; this warpgroup's rows see none, or it skips their first blocks),
    with more units than CTAs in each grid."""
    knobs = OVERLAP_CONFIGS[name]
    seen = set()
    for shape in SHAPES + OVERLAP_SHAPES:
        for clusters in (2, 3):
            seen |= _steps(knobs, shape, clusters)
    assert seen == {
        "step",
        "step into one key block",
        "next unit without key blocks",
        "next unit's rows of the warpgroup see no key",
        "next unit's first blocks skipped",
    }, seen


@pytest.mark.parametrize("name", ["overlap", "overlap_cluster", "overlap_dynamic", "early_q_cluster_kv1"])
def test_unit_overlap_steps_where_it_can(name):
    """The model does step: each unit whose warpgroup computes every key block of the next one, in the CTA's
    order, is stepped into (those of one key block too), and no other."""
    from tests.kernels.sm90_protocol_model import Model

    knobs = OVERLAP_CONFIGS[name]
    shape = OVERLAP_SHAPES[1] if knobs.cta_mode == 2 else OVERLAP_SHAPES[0]
    steps = set()
    for units in [[]] if knobs.scheduler else cluster_units(knobs, shape, 2):
        model = Model(knobs, shape, units, random.Random(0), counter=TileCounter(), grid=1)
        model.start()
        model.run()
        model.check_results()
        steps |= set(model.steps)
        for rank, cta in enumerate(model.ctas):
            for unit, nxt in itertools.pairwise(cta.units):
                for wg in range(knobs.consumer_wgs):
                    can = _compute_end(shape, unit, wg) > 0 and _compute_end(shape, nxt, wg) == nxt.n_block_max > 0
                    assert ((unit.index, nxt.index, rank, wg) in model.steps) == can, (unit, nxt, rank, wg)
    assert steps


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
# unit_overlap's faults: with its loop (early_q_waits with its producer, unit_overlap = 2). The step with a skip on
# the shared K/V barrier (kv_barriers = 1): with 2 stages the first block computed after one skipped block needs
# the stage whose V the pending P.V reads. With split barriers K's stage is free once read, so it takes two
# skipped blocks (V's wait), and a lone CTA's warpgroups (two, 64-key blocks) skip at most one.
FAULT_KNOBS = {
    name: Knobs(
        persistent=True,
        block_n=64,
        kv_barriers=1 if name.startswith("kv1") or name == "unit_overlap_step_with_skip" else 2,
        scheduler=int(name in DYNAMIC_FAULTS),
        q_stages=1 if name in ONE_Q_STAGE_FAULTS else 2,
        unit_overlap=name in UNIT_OVERLAP_FAULTS,
        early_q=name.startswith("early_q"),
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
    + [  # unit_overlap's faults with the dynamic scheduler (not no_q_wait: its consumer_unit waits) and clusters
        (f"{name}@{where}", dataclasses.replace(FAULT_KNOBS[name], **knobs))
        for where, knobs in (("dynamic", {"scheduler": 1}), ("cluster", {"cta_mode": 2}))
        for name in sorted(UNIT_OVERLAP_FAULTS)
        if not (where == "dynamic" and name == "unit_overlap_no_q_wait")
    ]
)
#: the shapes a planted fault is tried on: unit_overlap's need many units of several key blocks in 2-CTA clusters
FAULT_SHAPES = [*SHAPES[:3], *OVERLAP_SHAPES]


FAULT_SEEDS = 40  # random timings tried per shape before a planted fault counts as missed


@pytest.mark.parametrize(("case", "knobs"), FAULT_CASES, ids=[c for c, _ in FAULT_CASES])
def test_a_planted_fault_is_caught(case, knobs):
    """Under random timings, within FAULT_SEEDS seeds on FAULT_SHAPES (the first run that catches it
    ends the search): a race shows only in some interleavings (sentinel_without_wait in 4 of 30 seeds of one
    shape, since warpgroups of padding rows skip their key blocks and finish early)."""
    for seed in range(FAULT_SEEDS):
        for shape in FAULT_SHAPES:
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
