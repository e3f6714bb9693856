"""tuner.search._pattern and _model: the default search's pieces on small spaces and the real sm90 space."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest

from tuner.devices import limits_for_arch
from tuner.problem import Problem
from tuner.search import PatternSearch, make_search
from tuner.search._model import TREND, AdditiveModel
from tuner.search._pattern import LEVELS, REPAIRS_KEPT, constraint_knobs, ring
from tuner.space import config_key, load_space

SM80 = limits_for_arch(80)
DATA = Path(__file__).resolve().parents[1] / "data"
H200 = limits_for_arch(90)


def _grid(space):
    names = [k.name for k in space.knobs]
    return [dict(zip(names, v)) for v in itertools.product(*(k.values for k in space.knobs))]


def _changed(a, b):
    return {k for k in a if a[k] != b[k]}


def _ruled(space):
    """The knobs the space's [[defaults]] rules set: a move's rule partner may change them too."""
    return {k for rule in space.default_rules for k, _ in rule.values}


# -- neighbourhoods ----------------------------------------------------------------------------------
def test_ring_counts_ordered_steps(toy_space):
    start = {"block_m": 64, "block_n": 64, "stages": 2, "flag": 0}
    one = list(ring(toy_space, start, 1))
    assert sorted(tuple(sorted(_changed(c, start))) for c in one) == sorted(
        [("block_m",)] * 2 + [("block_n",)] * 2 + [("stages",)] * 2 + [("flag",)]
    )
    corner = {"block_m": 32, "block_n": 64, "stages": 2, "flag": 0}
    two = list(ring(toy_space, corner, 2))
    assert {**corner, "block_m": 128} in two  # two values along: two steps
    assert {**corner, "block_m": 128} not in list(ring(toy_space, corner, 1))
    assert all(len(_changed(c, corner)) <= 2 for c in two) and len({config_key(c) for c in two}) == len(two)
    assert all(c["stages"] == 2 for c in ring(toy_space, corner, 2, keep={"stages"}))


def test_constraints_read_knobs_through_derived_values(toy_space):
    assert constraint_knobs(toy_space) == {"smem_fits": {"block_m", "block_n", "stages"}}
    sm90 = constraint_knobs(load_space("sm90"))
    assert sm90["setmaxnreg_budget"] == {"producer_regs", "consumer_wgs", "consumer_regs", "ctas_per_sm"}
    assert sm90["arch"] == set()


# -- the surrogate -----------------------------------------------------------------------------------
def test_the_additive_model_recovers_additive_effects_and_continues_ordered_trends(toy_space):
    model = AdditiveModel(toy_space, ridge=1e-6)
    effect = {
        "block_m": {32: 0.0, 64: 0.1, 128: 0.2},
        "block_n": {32: 0.0, 64: -0.05, 128: 0.3},
        "stages": {1: 0.0, 2: 0.05, 3: 0.0},
        "flag": {0: 0.0, 1: 0.02},
    }

    def tflops(c):
        return 100 * math.exp(sum(effect[k][v] for k, v in c.items()))

    start = {"block_m": 64, "block_n": 64, "stages": 2, "flag": 0}
    assert model.predict(start) == 0.0  # nothing known yet
    for c in [
        start,
        {**start, "block_m": 32},
        {**start, "block_n": 128},
        {**start, "stages": 1},
        {**start, "stages": 3},
        {**start, "flag": 1},
        {**start, "block_n": 32},
    ]:
        model.add(c, tflops(c))
    assert model.count == 7
    for c in _grid(toy_space):
        if c["block_m"] != 128:
            assert model.predict(c) == pytest.approx(math.log(tflops(c)), abs=1e-4)
    # block_m 128 was never measured: beyond 32 -> 64 the slope continues at TREND of its size
    slope = model.effect("block_m", 64) - model.effect("block_m", 32)
    assert model.effect("block_m", 128) == pytest.approx(model.effect("block_m", 64) + TREND * slope)


def test_an_unmeasured_value_between_two_measured_ones_is_interpolated_and_a_category_stays_neutral(tmp_path):
    from tests.conftest import toy_space_text

    text = toy_space_text(block_n=(32, 64, 96, 128)).replace(
        'help = "a boolean knob"', 'help = "a boolean knob"\nordered = false'
    )
    (tmp_path / "toy.toml").write_text(text)
    space = load_space(tmp_path / "toy.toml")
    model = AdditiveModel(space, ridge=1e-6)
    start = {"block_m": 64, "block_n": 32, "stages": 2, "flag": 0}
    model.add(start, 100.0)
    model.add({**start, "block_n": 128}, 130.0)
    lo, hi = model.effect("block_n", 32), model.effect("block_n", 128)
    assert model.effect("block_n", 64) == pytest.approx(lo + (hi - lo) / 3)
    assert model.effect("flag", 1) == 0.0


def test_a_failed_config_counts_as_worse_than_the_worst_that_ran(toy_space):
    model = AdditiveModel(toy_space)
    start = {"block_m": 64, "block_n": 64, "stages": 2, "flag": 0}
    model.add(start, 100.0)
    model.add({**start, "flag": 1}, 90.0)
    model.add_failure({**start, "stages": 3})
    assert model.predict({**start, "stages": 3}) < model.predict({**start, "flag": 1}) < model.predict(start)


# -- the search --------------------------------------------------------------------------------------
def _run(search, tflops, n, taken=None):
    """Propose, measure and observe n configs one at a time (window 1); returns them in order."""
    taken = set() if taken is None else taken
    out = []
    for _ in range(n):
        config = search.propose(taken)
        if config is None:
            break
        taken.add(config_key(config))
        search.observe(config, tflops(config))
        out.append(config)
    return out


def test_the_default_neighbourhood_comes_first_then_the_search_follows_an_improvement(toy_space, problem):
    search = PatternSearch(toy_space, problem, SM80, seed=1)
    start = toy_space.defaults(problem.head_dim)
    search.observe(start, 100.0)
    feasible = [c for c in ring(toy_space, start, 1) if toy_space.check(c, problem, SM80) is None]
    taken = {config_key(start)}
    better = {**start, "stages": 3}  # (64 + 2 * 3 * 64) rows of 256 B fit sm_80's shared memory
    assert better in feasible

    def tflops(c):  # only stages=3 helps; everything else is worse than the default
        return 110.0 if c == better else 120.0 if c == {**better, "flag": 1} else 90.0

    first = search.propose(taken)
    assert first in feasible
    taken.add(config_key(first))
    search.observe(first, tflops(first))
    proposed = [first]
    while proposed[-1] != better:
        proposed.append(search.propose(taken))
        taken.add(config_key(proposed[-1]))
        search.observe(proposed[-1], tflops(proposed[-1]))
    assert all(c in feasible for c in proposed)  # the default's one-step neighbours until one improves
    after = search.propose(taken)
    assert len(_changed(after, better)) == 1  # first improvement: now around stages=3
    assert search.stats.repeats == 0 and search.stats.asks == len(proposed) + 1


def test_every_feasible_config_once_then_none(toy_space, problem):
    search = make_search("pattern", toy_space, problem, SM80, 3)
    rng = random.Random(0)
    values = {config_key(c): rng.uniform(50, 150) for c in _grid(toy_space)}
    start = toy_space.defaults(problem.head_dim)
    search.observe(start, values[config_key(start)])
    taken = {config_key(start)}
    proposed = _run(search, lambda c: values[config_key(c)], 1000, taken)
    feasible = [c for c in _grid(toy_space) if toy_space.check(c, problem, SM80) is None]
    assert len(feasible) < len(_grid(toy_space))  # the toy space has infeasible corners
    assert all(toy_space.check(c, problem, SM80) is None for c in proposed)
    assert len({config_key(c) for c in proposed}) == len(proposed) == len(feasible) - 1
    assert search.propose(taken) is None
    assert search.stats.repeats == 0


def test_proposals_before_any_result_spread_over_the_default_neighbourhood_and_skip_taken_configs(toy_space, problem):
    search = PatternSearch(toy_space, problem, SM80, seed=0)
    start = toy_space.defaults(problem.head_dim)
    elsewhere = {**start, "flag": 1}  # another tuner measures it
    taken = {config_key(start), config_key(elsewhere)}
    proposals = []
    for _ in range(8):  # compile-ahead: nothing measured yet, not even the default
        config = search.propose(taken)
        taken.add(config_key(config))
        proposals.append(config)
    assert elsewhere not in proposals and len({config_key(c) for c in proposals}) == 8
    steps = [c for c in ring(toy_space, start, 1) if toy_space.check(c, problem, SM80) is None and c != elsewhere]
    assert proposals[: len(steps)] == sorted(steps, key=proposals.index)  # the nearest level first, then wider ones
    search.withdraw(proposals[0])  # not measured after all (the tuner stopped): it may come again
    taken.discard(config_key(proposals[0]))
    search.observe(start, 100.0)
    assert search.propose(taken) == proposals[0]  # the default's nearest neighbour left untaken


def test_a_move_the_constraints_couple_is_proposed_repaired():
    space = load_space("sm90")
    problem = Problem(batch=4, seqlen_q=4096, heads_q=16, head_dim=128, causal=True)
    search = PatternSearch(space, problem, H200, seed=0)
    start = space.defaults(128)
    alone = {**start, "producer_regs": 32}
    assert "setmaxnreg" in space.check(alone, problem, H200)  # 32 + 2 x 240 > 3 x 168
    search.observe(start, 500.0)
    key = config_key(start)
    coupled = search.neighbourhood(key, LEVELS.index("coupled step") + 1)
    repaired = [c for _, c in coupled if c["producer_regs"] == 32]
    assert repaired and all(space.check(c, problem, H200) is None for c in repaired)
    assert any(_changed(c, start) <= {"producer_regs", "consumer_regs", "consumer_wgs"} for c in repaired)
    assert all(_changed(c, start) - _ruled(space) <= {"producer_regs", "consumer_regs"} for c in repaired)
    steps = search.neighbourhood(key, 1)
    assert all(space.check(c, problem, H200) is None for _, c in steps)
    assert all(len(_changed(c, start) - _ruled(space)) <= 1 for _, c in steps)  # one knob, or with rule partners
    assert sum(len(_changed(c, start)) == 1 for _, c in steps) > len(steps) // 2


def test_a_move_refused_by_a_chain_of_constraints_is_repaired_along_it():
    """The dynamic scheduler needs persistent CTAs, and at d256 persistent CTAs fit shared memory only with one Q
    stage: the knobs of the first constraint alone cannot repair ``scheduler=1`` from a one-CTA-per-block default,
    so the coupled step follows the chain (held-out sweep 36 had its best there and never found it without)."""
    space = load_space("sm90")
    problem = Problem(batch=2, seqlen_q=4096, heads_q=16, head_dim=256)
    search = PatternSearch(space, problem, H200, seed=0)
    start = space.defaults(problem=problem, device=H200)
    assert (start["persistent"], start["scheduler"], start["q_stages"]) == (0, 0, 2)
    dynamic = {**start, "scheduler": 1}
    assert "persistent" in space.check(dynamic, problem, H200)
    assert "shared memory" in space.check({**dynamic, "persistent": 1}, problem, H200)
    assert search._repairs(dynamic, {"scheduler"}) == []  # without the chain: the first constraint's knobs only
    search.observe(start, 500.0)
    coupled = search.neighbourhood(config_key(start), LEVELS.index("coupled step") + 1)
    repaired = [c for _, c in coupled if c["scheduler"] == 1]
    assert repaired and all(space.check(c, problem, H200) is None for c in repaired)
    assert all(c["persistent"] == 1 and c["q_stages"] == 1 for c in repaired)
    chain = {"scheduler", "persistent", "q_stages", "block_n", "kv_stages"}
    assert any(_changed(c, start) <= chain for c in repaired)
    assert all(_changed(c, start) <= chain or (_changed(c, start) - chain) & _ruled(space) for c in repaired)


def test_a_move_a_default_rule_reads_is_tried_with_the_partner_the_rule_gives():
    """The space's [[defaults]] rules name a knob's partners: 2 consumer warpgroups at d64 take 176- or 192-key
    blocks (whichever pads the keys less). A coupled step to 2 warpgroups enters its level repaired and, beside it,
    with the block size the rules give (repaired again where the static check refuses it: held-out sweep 52's best,
    found after 40 results without, the climb reaching the block size one step at a time). A move no rule reads
    gets no partner."""
    for space in (load_space("sm90"), load_space(DATA / "sweep_spaces" / "sm90_sweep_d64e.toml")):
        for batch, heads, seqlen in ((1, 16, 6144), (2, 24, 3000), (8, 12, 1000)):
            problem = Problem(batch=batch, seqlen_q=seqlen, heads_q=heads, head_dim=64)
            search = PatternSearch(space, problem, H200, seed=0)
            start = space.defaults(64)
            assert start["consumer_wgs"] == 3 and start["block_n"] == 128
            search.observe(start, 400.0)
            coupled = [c for _, c in search.neighbourhood(config_key(start), LEVELS.index("coupled step") + 1)]
            assert all(space.check(c, problem, H200) is None for c in coupled)
            two = [c for c in coupled if c["consumer_wgs"] == 2]
            padded = {n: n * math.ceil(seqlen / n) for n in (128, 176, 192)}
            partner = 192 if padded[192] <= padded[176] else 176
            assert 10 * padded[partner] < 11 * padded[128]  # the rules give 2 warpgroups a wider block here
            assert any(c["block_n"] == 128 for c in two), problem.slug()  # the move, repaired
            assert any(c["block_n"] == partner for c in two), problem.slug()  # and with its partner
            steps = [c for _, c in search.neighbourhood(config_key(start), 1)]
            stages = [_changed(c, start) for c in steps if "kv_stages" in _changed(c, start)]
            assert stages and all(changed == {"kv_stages"} for changed in stages)  # no rule reads kv_stages


def test_a_refused_move_is_also_completed_by_the_rules_that_set_its_value_among_several():
    """A rule that sets several knobs names values measured to run together: the d256 tile rules set the dynamic
    scheduler with persistent CTAs, one Q stage and 64-key blocks. ``scheduler=1`` from a d256 default of one CTA
    per block (no tile rule holds: causal past 8192 keys, non-causal from 2048) is refused; its coupled step holds
    it repaired along the chain and, beside that, with the tile's other values (held-out sweeps 50 and 63, whose best
    is that tile: 30.5 and 41.5 evaluations with 17 in flight without, 26 and 27 with)."""
    space = load_space("sm90")
    tile = {"persistent": 1, "q_stages": 1, "block_n": 64, "scheduler": 1}
    for problem in (
        Problem(batch=1, seqlen_q=12288, heads_q=16, head_dim=256, causal=True),
        Problem(batch=2, seqlen_q=4096, heads_q=16, head_dim=256),
    ):
        start = space.defaults(problem=problem, device=H200)
        assert (start["persistent"], start["scheduler"]) == (0, 0), problem.slug()
        search = PatternSearch(space, problem, H200, seed=0)
        search.observe(start, 500.0)
        coupled = [c for _, c in search.neighbourhood(config_key(start), LEVELS.index("coupled step") + 1)]
        assert all(space.check(c, problem, H200) is None for c in coupled)
        assert any(all(c[k] == v for k, v in tile.items()) for c in coupled), problem.slug()


def _kept_repairs(space, problem) -> int:
    """Checks one start's coupled-step level; returns how many refused moves it keeps with several partners."""
    search = PatternSearch(space, problem, H200, seed=0)
    start = space.defaults(problem.head_dim)
    search.observe(start, 400.0)
    coupled = search.neighbourhood(config_key(start), LEVELS.index("coupled step") + 1)
    several = 0
    for knob in space.knobs:
        here = knob.values.index(start[knob.name])
        for i, value in enumerate(knob.values):
            move = {**start, knob.name: value}
            if not 0 < abs(i - here) <= max(1, (len(knob.values) - 1) // 4) or search.feasible(move):
                continue
            repairs = {config_key(c) for c in search._repairs(move, {knob.name}, chain=True)}
            kept = {k for k, c in coupled if c[knob.name] == value and k in repairs}
            assert len(kept) == min(REPAIRS_KEPT, len(repairs)), (knob.name, value)
            several += len(kept) > 1
    return several


def test_a_refused_move_is_kept_with_each_of_its_cheapest_partners():
    """A single step the static check refuses enters the coupled-step level once per minimal repair (up to
    REPAIRS_KEPT), not only with the partner the additive model likes: a tile size that pays only with
    ping-pong must not be hidden behind the repair the model prefers."""
    several = 0
    for space in (load_space("sm90"), load_space(DATA / "sweep_spaces" / "sm90_sweep_d64.toml")):
        for head_dim in space.family.head_dims:
            several += _kept_repairs(space, Problem(batch=4, seqlen_q=2048, heads_q=16, head_dim=head_dim))
    assert several > 0  # some refused move has more than one cheapest partner, and all of them are kept


def test_failed_configs_are_never_centres(toy_space, problem):
    search = PatternSearch(toy_space, problem, SM80, seed=0)
    start = toy_space.defaults(problem.head_dim)
    search.observe(start, 100.0)
    taken = {config_key(start)}
    first = search.propose(taken)
    taken.add(config_key(first))
    search.observe(first, None)
    assert config_key(first) not in search.values
    following = _run(search, lambda c: 90.0, 5, taken)
    assert all(len(_changed(c, start)) == 1 for c in following)  # still around the default


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_proposing_on_the_real_sm90_space_is_fast(head_dim):
    """Study sizes of 300 trials: one proposal (checks and repairs included) costs under 10 ms on average."""
    import time

    space = load_space("sm90")
    problem = Problem(batch=4, seqlen_q=4096, heads_q=16, head_dim=head_dim, causal=head_dim != 64)
    search = PatternSearch(space, problem, H200, seed=0)
    start = space.defaults(head_dim)
    rng = random.Random(0)
    search.observe(start, 400.0)
    taken = {config_key(start)}
    t0 = time.perf_counter()
    proposed = _run(search, lambda c: rng.uniform(300, 500), 300, taken)
    per_call_ms = (time.perf_counter() - t0) / len(proposed) * 1e3
    assert len(proposed) == 300 and all(space.check(c, problem, H200) is None for c in proposed[::25])
    assert per_call_ms < 10, f"{per_call_ms:.1f} ms per proposal and observation"


def test_proposing_with_17_in_flight_is_fast(monkeypatch):
    """With a compile-ahead window of 17 the pattern move runs on every proposal. Each measured config's combination
    is kept until a new move from it is measured, so far fewer are computed than the move looks up (without the
    cache: every one, every time, about 2x the time per proposal), and 300 trials on the real sm90 space cost under
    10 ms per proposal on average."""
    import time

    space = load_space("sm90")
    problem = Problem(batch=4, seqlen_q=4096, heads_q=16, head_dim=128, causal=True)
    search = PatternSearch(space, problem, H200, seed=0)
    combined = []
    combine = search._combine
    monkeypatch.setattr(search, "_combine", lambda key: combined.append(key) or combine(key))
    rng = random.Random(0)
    taken: set[str] = set()
    flight: list[dict] = []
    made = looked_up = 0
    t0 = time.perf_counter()
    while made < 300:
        while len(flight) < 17 and (config := search.propose(taken)) is not None:
            looked_up += len(search._moves)  # the measured configs the pattern move looks at
            taken.add(config_key(config))
            flight.append(config)
            made += 1
        if not flight:
            break
        search.observe(flight.pop(0), rng.uniform(300, 500))
    per_call_ms = (time.perf_counter() - t0) / made * 1e3
    assert made >= 300 and search.stats.repeats == 0
    assert 0 < len(combined) < looked_up / 2, (len(combined), looked_up)
    assert per_call_ms < 10, f"{per_call_ms:.1f} ms per proposal and observation"


# -- in the tuning loop --------------------------------------------------------------------------------
def test_the_pattern_search_runs_a_stored_study_and_resumes_it(sqlite_url, toy_space, problem):
    from tests.fakes.fake_compile import fake_compiler
    from tests.fakes.fake_measure import FakeMeasure
    from tuner import study as st
    from tuner.run import TuneSettings, tune
    from tuner.search import make_sampler
    from tuner.study import open_storage

    gpu = {
        "name": "Fake GPU",
        "arch": 80,
        "num_sms": 108,
        "smem_per_block_optin": 166912,
        "regs_per_sm": 65536,
        "driver": "0.0",
    }
    storage = open_storage(sqlite_url)
    study = st.open_study(
        storage=storage,
        name="pattern",
        space=toy_space,
        problem=problem,
        gpu=gpu,
        sampler=make_sampler("pattern", toy_space, 0),
    )

    def run(n):
        search = make_search("pattern", toy_space, problem, SM80, 0)
        summary = tune(
            study,
            toy_space,
            problem,
            SM80,
            FakeMeasure(),
            TuneSettings(n_trials=n, compile_workers=1),
            search=search,
            compiler=fake_compiler,
        )
        return summary, search

    summary, search = run(6)
    trials = [t for t in study.get_trials() if t.user_attrs.get(st.STATUS) not in (None, "infeasible")]
    assert summary.evaluated == 6 and trials[0].params == toy_space.defaults()
    assert len({config_key(t.params) for t in trials}) == 6 and search.stats.repeats == 0
    assert summary.explorations == 0
    summary, search = run(10)  # a new process: it learns the six from the study and goes on from the best
    assert summary.evaluated == 4 and len(search.values) >= 6
    keys = [
        config_key(t.params)
        for t in study.get_trials()
        if t.user_attrs.get(st.STATUS) not in (None, "infeasible") and st.DUPLICATE_OF not in t.user_attrs
    ]
    assert len(keys) == len(set(keys)) == 10


# -- the interaction surrogate (issue 17) ----------------------------------------------------------------
def test_the_interaction_surrogate_sees_a_pair_that_pays_only_together_and_the_additive_model_does_not(toy_space):
    from tuner.search._surrogate import InteractionGP

    def tflops(c):  # block_n 128 and flag 1 each cost 3% alone and gain 5% together
        a, b = c["block_n"] == 128, c["flag"] == 1
        return 100.0 * (1.05 if a and b else 0.97 if a or b else 1.0) * (1 + 0.01 * c["stages"])

    gp, additive = InteractionGP(toy_space), AdditiveModel(toy_space)
    known = [c for c in _grid(toy_space) if not (c["block_n"] == 128 and c["flag"] == 1) or c["stages"] == 1]
    for c in known:
        gp.add(c, tflops(c))
        additive.add(c, tflops(c))
    pair = {"block_m": 64, "block_n": 128, "stages": 3, "flag": 1}
    alone = {**pair, "flag": 0}
    mean, _ = gp.predict(gp.encode([pair, alone]))
    assert mean[0] > mean[1]  # learned from the stages=1 configs that hold the pair
    assert additive.predict(pair) < additive.predict(alone) + 0.02  # an additive fit blurs the pair away


def test_configs_in_flight_shrink_the_surrogates_uncertainty_near_them(toy_space):
    from tuner.search._surrogate import InteractionGP

    gp = InteractionGP(toy_space)
    start = {"block_m": 64, "block_n": 64, "stages": 2, "flag": 0}
    gp.add(start, 100.0)
    near, far = {**start, "flag": 1}, {"block_m": 128, "block_n": 128, "stages": 3, "flag": 1}
    _, alone = gp.predict(gp.encode([near, far]))
    _, pending = gp.predict(gp.encode([near, far]), gp.encode([near]))
    assert pending[0] < alone[0] * 0.8 and pending[1] == pytest.approx(alone[1], rel=0.2)


def test_a_batch_of_surrogate_proposals_before_any_result_is_diverse_not_one_neighbourhood():
    """Compile-ahead: 16 proposals before the default's result; with the surrogate proposing, they spread over
    the space (most are more than one knob from the default, and from each other)."""
    space = load_space("tests/search/sm90_d64.toml")
    problem = Problem(batch=4, seqlen_q=2048, heads_q=16, head_dim=64, causal=False)
    search = PatternSearch(space, problem, H200, seed=0, bo_share=(1.0, 1.0))
    start = space.defaults(64)
    taken = {config_key(start)}
    batch = []
    for _ in range(16):
        config = search.propose(taken)
        taken.add(config_key(config))
        batch.append(config)
    assert len({config_key(c) for c in batch}) == 16
    assert sum(len(_changed(c, start)) > 1 for c in batch) >= 12
    spread = [min(len(_changed(a, b)) for b in batch if b is not a) for a in batch]
    assert sum(spread) / len(spread) >= 2


def test_with_the_surrogate_off_the_climb_alone_proposes_until_it_is_spent(toy_space, problem):
    search = PatternSearch(toy_space, problem, SM80, seed=0)
    start = toy_space.defaults(problem.head_dim)
    search.observe(start, 100.0)
    _run(search, lambda c: 90.0, 5, {config_key(start)})
    assert search._made == {"pattern": 5, "surrogate": 0}


# -- restarts and spread batches (issue 17) ------------------------------------------------------------
def _far_seeds(space, problem, start, n):
    """``n`` feasible configs three or more knobs from ``start`` and from each other's neighbourhoods."""
    out = []
    for c in _grid(space):
        far = len(_changed(c, start)) >= 3 and all(len(_changed(c, o)) >= 3 for o in out)
        if far and space.check(c, problem, SM80) is None:
            out.append(c)
    assert len(out) >= n, "the toy space has no such seeds"
    return out[:n]


def test_a_stalled_climb_restarts_from_every_seed_in_the_order_given(toy_space, problem):
    """Nothing beats the default; the seeds (neighbouring shapes' winners) measure worse than it, so the climb
    alone would never centre on them. Each stall restarts from the next seed: its neighbours come next."""
    from tuner.search._pattern import STALL

    search = PatternSearch(toy_space, problem, SM80, seed=0)
    start = toy_space.defaults(problem.head_dim)
    first, second = _far_seeds(toy_space, problem, start, 2)
    search.add_start(first)
    search.add_start(second)
    search.add_start(dict(first))  # given twice: one seed
    taken = set()
    for config, value in ((first, 90.0), (second, 80.0), (start, 100.0)):  # the best last: no stall yet
        search.observe(config, value)
        taken.add(config_key(config))
    proposed = _run(search, lambda c: 95.0, 3 * STALL + 4, taken)
    near = [min(len(_changed(c, s)) for s in (start, first, second)) for c in proposed]
    owner = [
        next(i for i, s in enumerate((start, first, second)) if len(_changed(c, s)) == near[j])
        for j, c in enumerate(proposed)
    ]
    assert owner[:STALL] == [0] * STALL  # the default's neighbours first
    assert 1 in owner and 2 in owner and owner.index(1) == STALL  # the stall restarts from the first seed
    assert owner.index(2) > owner.index(1) + STALL - 1  # and its stall from the second
    assert search.stats.repeats == 0


def test_a_seed_nobody_measured_is_proposed_itself_when_the_climb_stalls(toy_space, problem):
    from tuner.search._pattern import STALL

    search = PatternSearch(toy_space, problem, SM80, seed=0)
    start = toy_space.defaults(problem.head_dim)
    (seed,) = _far_seeds(toy_space, problem, start, 1)
    search.add_start(seed)
    search.observe(start, 100.0)
    proposed = _run(search, lambda c: 95.0, STALL + 1, {config_key(start)})
    assert seed not in proposed[:STALL] and proposed[STALL] == seed


def test_a_batch_in_flight_spreads_over_other_centres(toy_space, problem, monkeypatch):
    """With a window of proposals in flight, a share comes from centres other than the incumbent while the
    incumbent's nearest neighbours are not spent yet (the climb alone proposes only those)."""
    from tuner.search import _pattern

    start = toy_space.defaults(problem.head_dim)
    other = {**start, "block_m": 32}

    def batch():
        search = PatternSearch(toy_space, problem, SM80, seed=0)
        taken = {config_key(start), config_key(other)}
        search.observe(start, 100.0)
        search.observe(other, 99.0)  # within noise of the best: another region worth a share of the batch
        steps = {k for k, _ in search.neighbourhood(config_key(start), 1)} - taken
        out = []
        for _ in steps:
            out.append(search.propose(taken))
            taken.add(config_key(out[-1]))
        return [c for c in out if config_key(c) not in steps]

    away = batch()
    assert away and all(len(_changed(c, other)) == 1 for c in away)
    monkeypatch.setattr(_pattern, "SPREAD", 0.0)
    assert batch() == []


def test_the_pair_jump_level_changes_two_knobs_one_beyond_a_step(toy_space, problem):
    search = PatternSearch(toy_space, problem, SM80, seed=0)
    corner = {**toy_space.defaults(problem.head_dim), "block_m": 32}  # block_m 128 is two steps away
    search.observe(corner, 100.0)
    jumps = [c for _, c in search.neighbourhood(config_key(corner), LEVELS.index("pair jump") + 1)]
    pairs = {config_key(c) for _, c in search.neighbourhood(config_key(corner), LEVELS.index("pair") + 1)}
    assert jumps and all(len(_changed(c, corner)) == 2 and c["block_m"] == 128 for c in jumps)
    assert all(toy_space.check(c, problem, SM80) is None for c in jumps)
    assert not pairs & {config_key(c) for c in jumps}


def test_the_loop_gives_the_search_every_warm_start(sqlite_url, toy_space, problem):
    from tests.fakes.fake_compile import fake_compiler
    from tests.fakes.fake_measure import FakeMeasure
    from tuner import study as st
    from tuner.run import TuneSettings, tune
    from tuner.search import make_sampler
    from tuner.study import open_storage

    gpu = {"name": "Fake GPU", "arch": 80, "num_sms": 108, "smem_per_block_optin": 166912, "regs_per_sm": 65536}
    study = st.open_study(
        storage=open_storage(sqlite_url),
        name="warm",
        space=toy_space,
        problem=problem,
        gpu={**gpu, "driver": "0.0"},
        sampler=make_sampler("pattern", toy_space, 0),
    )
    start = toy_space.defaults(problem.head_dim)
    seeds = _far_seeds(toy_space, problem, start, 2)
    for i, config in enumerate(seeds):
        study.enqueue_trial(config, user_attrs={st.WARM_START: f"shape-{i}"})
    given = []

    class Recording(PatternSearch):
        def add_start(self, config):
            given.append(config)
            super().add_start(config)

    search = Recording(toy_space, problem, SM80, seed=0)
    tune(
        study,
        toy_space,
        problem,
        SM80,
        FakeMeasure(),
        TuneSettings(n_trials=6, compile_workers=1),
        search=search,
        compiler=fake_compiler,
    )
    assert given == seeds


def test_the_trace_tool_follows_one_landscape_to_its_planted_best():
    """tests/search/trace.py: one line per evaluation, the default first, the planted best marked where it ends."""
    from tests.search.trace import trace

    lines = trace("island", 0, 60)
    assert lines[1].startswith("  1 ") and lines[1].endswith("(default)")
    assert lines[-1].endswith("***") and all(" from [" in line for line in lines[2:])
    assert trace("island", 0, 60) == lines  # seeded: the same lines again


def test_the_trace_tool_with_a_window_follows_replays_own_run():
    """--window 17: the configs in the order replay's run asked the oracle, the default first, as many as replay
    counts until its first within 1% of the best, and the same lines again for the seed."""
    from tests.search.test_search_quality import _hits, _oracle
    from tests.search.trace import trace_window
    from tuner.run import replay
    from tuner.search import DEFAULT_SEARCH

    name = "d64-fp16-causal-n4096"
    lines = trace_window(name, 1, 50, 17)
    assert "17 in flight" in lines[0] and lines[1].endswith("(default)") and lines[-1].endswith("***")
    assert len(lines) - 1 == _hits(replay(_oracle(name), [DEFAULT_SEARCH], [1], 50, window=17))[0]
    assert trace_window(name, 1, 50, 17) == lines


def test_the_trace_tool_follows_a_stored_sweep_to_within_1_percent_of_its_best():
    """On a design sweep the run ends at its first config within 1% of the sweep's best, marked; before it,
    none is."""
    from tests.search.test_search_quality import STORED
    from tests.search.trace import trace

    lines = trace(sorted(STORED)[0], 0, 50)
    assert lines[0].startswith("replay of ") and lines[1].endswith("(default)")
    ratios = [float(line.split()[1]) for line in lines[1:]]
    assert lines[-1].endswith("***") and ratios[-1] >= 0.99 and all(r < 0.99 for r in ratios[:-1])


def test_with_a_batch_in_flight_the_steps_that_paid_are_proposed_together(toy_space, problem):
    """Hooke and Jeeves' pattern move: the default's single-knob changes that measured better (not the one that
    lost) applied at once, once SPREAD_AFTER proposals are in flight; before that the climb proposes alone."""
    from tuner.search._pattern import SPREAD_AFTER

    start = toy_space.defaults(problem.head_dim)
    paid = [{**start, "flag": 1 - start["flag"]}, {**start, "block_n": 32}, {**start, "stages": 1}]
    lost = {**start, "block_m": 32}
    together = {**start, "flag": 1 - start["flag"], "block_n": 32, "stages": 1}
    assert all(toy_space.check(c, problem, SM80) is None for c in [*paid, lost, together])
    search = PatternSearch(toy_space, problem, SM80, seed=0)
    search.observe(start, 100.0)
    for config, tflops in zip([*paid, lost], (104.0, 103.0, 102.0, 90.0)):
        search.observe(config, tflops)
    taken = {config_key(c) for c in [start, *paid, lost]}
    before = [search.propose(taken) for _ in range(SPREAD_AFTER)]
    assert together not in before and all(len(_changed(c, start)) <= 2 for c in before)
    assert search.propose(taken) == together
    assert search.propose(taken) != together  # proposed once


def test_the_pattern_move_combines_a_coupled_step_with_single_steps_on_other_knobs(toy_space, problem):
    """A move of two knobs that paid (a coupled step) joins the pattern move like a single step; a move that paid
    less and changes one of its knobs again does not."""
    start = toy_space.defaults(problem.head_dim)
    coupled = {**start, "block_n": 32, "stages": 1}
    single = {**start, "flag": 1 - start["flag"]}
    overlapping = {**start, "stages": 3}  # paid, but less than the coupled step that sets stages too
    together = {**start, "flag": 1 - start["flag"], "block_n": 32, "stages": 1}
    assert all(toy_space.check(c, problem, SM80) is None for c in [coupled, single, overlapping, together])
    search = PatternSearch(toy_space, problem, SM80, seed=0)
    search.observe(start, 100.0)
    for config, tflops in [(single, 105.0), (coupled, 103.0), (overlapping, 102.0)]:
        search.observe(config, tflops)
    taken = {config_key(c) for c in [start, coupled, single, overlapping]}
    assert search._pattern_move(taken) == together  # single steps only: flag with stages 3


def test_a_neighbour_no_better_than_the_incumbent_waits_behind_its_coupled_step(toy_space, problem, monkeypatch):
    """A measured config one knob from a better one ranks as that config's pair level (BEHIND_LEVELS): a neighbour
    within noise below the incumbent does not have its own single steps tried before the incumbent's coupled step."""
    from tuner.search import _pattern

    start = toy_space.defaults(problem.head_dim)
    best = {**start, "block_n": 128}
    search = PatternSearch(toy_space, problem, SM80, seed=0)
    search.observe(start, 80.0)
    search.observe(best, 100.0)
    here = config_key(best)
    steps = [c for _, c in search.neighbourhood(here, 1)]
    coupled = {**best, "block_n": 64, "stages": 3}  # stages 3 alone overflows shared memory with 128-key blocks
    assert [c for _, c in search.neighbourhood(here, 2)] == [coupled]
    twin = {**best, "block_m": 32}
    for config in steps:
        search.observe(config, 99.9 if config == twin else 80.0)
    taken = {config_key(c) for c in [start, best, *steps]}
    assert search.propose(taken) == coupled
    assert search._priority(config_key(twin), 1) < search._priority(here, 2) - _pattern.BAND
    monkeypatch.setattr(_pattern, "BEHIND_LEVELS", 0)  # without the rule the twin's steps rank above the coupled step
    assert search._priority(config_key(twin), 1) > search._priority(here, 2)
