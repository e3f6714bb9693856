"""Partial configs made whole (tuner.space.complete): the given knobs kept, the others at their defaults or, where
those cannot run beside them, at the nearest feasible values by the stated rule, the moved ones said; checked
against a brute-force search of a small synthetic space, and on the sm80 and sm90 spaces. No GPU."""

from __future__ import annotations

import itertools

import pytest

from tests.conftest import toy_space_text
from tuner.devices import limits_for_arch
from tuner.problem import Problem
from tuner.space import ConfigError, complete, conflicts, load_space
from tuner.space import _complete as complete_module

H200, A100 = limits_for_arch(90), limits_for_arch(80)


def _problem(head_dim: int) -> Problem:
    return Problem(batch=1, seqlen_q=4096, heads_q=8, head_dim=head_dim)


@pytest.fixture(scope="module")
def sm90():
    return load_space("sm90")


@pytest.fixture(scope="module")
def sm80():
    return load_space("sm80")


# -- the rule, against a brute-force search of a small space -----------------------------------------------
def _synthetic(tmp_path, ordered_stages: bool):
    """The toy space with more values and two constraints that tie its knobs together; stages a category
    knob or not."""
    text = toy_space_text(block_m=(16, 32, 64, 128), stages=(1, 2, 3, 4)) + (
        '\n[constraints.flag_needs_a_deep_ring_or_a_short_tile]\nexpr = "not flag or stages == 4 or block_m == 16"\n'
        'message = "flag needs 4 stages or 16 rows"\n'
        '\n[constraints.tile_shape]\nexpr = "block_n <= 4 * block_m"\nmessage = "block_n {block_n} > 4 x block_m"\n'
    )
    if not ordered_stages:
        text = text.replace('help = "K/V ring depth"', 'help = "K/V ring depth"\nordered = false')
    path = tmp_path / "spaces" / "toy.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return load_space(path)


def _nearest_by_brute_force(space, given, problem, device):
    """Every completion of ``given`` that runs, ranked by the rule: fewest moved, distance, knob order, value order."""
    base = space.validate(given, partial=True, head_dim=problem.head_dim, arch=device.arch)
    free = [k for k in space.knobs if k.name not in given]
    ranked = []
    for values in itertools.product(*(k.values for k in free)):
        config = {**base, **{k.name: v for k, v in zip(free, values)}}
        if space.check(config, problem, device):
            continue
        moved = [(i, k) for i, k in enumerate(space.knobs) if config[k.name] != base[k.name]]
        steps = [
            abs(k.values.index(config[k.name]) - k.values.index(base[k.name])) if k.ordered else 1 for _, k in moved
        ]
        ranked.append(
            (
                (len(moved), sum(steps), [i for i, _ in moved], [k.values.index(config[k.name]) for _, k in moved]),
                config,
            )
        )
    return min(ranked, key=lambda r: r[0])[1] if ranked else None


@pytest.mark.parametrize("ordered_stages", [True, False], ids=["ordered", "category"])
def test_every_partial_config_of_a_small_space_completes_as_a_full_search_ranks_it(tmp_path, ordered_stages):
    space = _synthetic(tmp_path, ordered_stages)
    problem = Problem(batch=1, seqlen_q=512, heads_q=2, head_dim=128)
    moved_some = refused = 0
    for choice in itertools.product(*([None, *k.values] for k in space.knobs)):
        given = {k.name: v for k, v in zip(space.knobs, choice) if v is not None}
        expected = _nearest_by_brute_force(space, given, problem, A100)
        if expected is None:
            with pytest.raises(ConfigError, match="cannot run"):
                complete(space, given, problem, A100)
            refused += 1
            continue
        completion = complete(space, given, problem, A100)
        assert completion.config == expected, given
        assert all(completion.config[k] == v for k, v in given.items())
        defaults = space.validate(given, partial=True, head_dim=128, arch=80)
        assert completion.moved == tuple((k, defaults[k], v) for k, v in expected.items() if v != defaults[k])
        assert bool(completion.note) == bool(completion.moved)
        moved_some += bool(completion.moved)
    assert moved_some >= 20 and refused >= 50, (moved_some, refused)  # the rule decided something


def test_a_category_knob_moves_one_step_to_any_of_its_values(tmp_path):
    """flag=1 needs stages 2 -> 4 or block_m 64 -> 16: two steps each along ordered values (a tie the knob
    order breaks: block_m comes first), but stages as a category moves one step to any value."""
    problem = Problem(batch=1, seqlen_q=512, heads_q=2, head_dim=128)
    assert complete(_synthetic(tmp_path, True), {"flag": 1}, problem, A100).moved == (("block_m", 64, 16),)
    assert complete(_synthetic(tmp_path, False), {"flag": 1}, problem, A100).moved == (("stages", 2, 4),)


# -- sm90 ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("head_dim", [64, 128])
def test_one_cta_per_block_alone_moves_only_the_dynamic_scheduler(sm90, head_dim):
    completion = complete(sm90, {"persistent": 0}, _problem(head_dim), H200)
    assert completion.config == {**sm90.defaults(head_dim, 90), "persistent": 0, "scheduler": 0}
    assert completion.moved == (("scheduler", 1, 0),)
    note = completion.note
    assert note.startswith("sm90: the default scheduler=1 cannot run") and "with persistent=0" in note, note
    assert "dynamic_scheduler_persistent" in note and note.endswith(
        "took scheduler=0, the nearest completion that runs"
    )


def test_head_dim_256_is_one_cta_per_block_already_and_moves_nothing(sm90):
    completion = complete(sm90, {"persistent": 0}, _problem(256), H200)
    assert completion.config == sm90.defaults(256, 90) and completion.moved == () and completion.note == ""


def test_a_cluster_alone_takes_the_register_budgets_and_the_static_order(sm90):
    """cta_mode=2 at d128: the producer needs 32 registers, which leaves 232 per consumer, and a cluster runs the
    static scheduler: the partial the build tests once spelled out knob by knob."""
    completion = complete(sm90, {"cta_mode": 2}, _problem(128), H200)
    assert [name for name, _, _ in completion.moved] == ["producer_regs", "consumer_regs", "scheduler"]
    assert completion.config == {
        **sm90.defaults(128, 90),
        "cta_mode": 2,
        "producer_regs": 32,
        "consumer_regs": 232,
        "scheduler": 0,
    }


def test_one_q_stage_at_head_dim_256_takes_persistent_ctas(sm90):
    completion = complete(sm90, {"q_stages": 1}, _problem(256), H200)
    assert completion.moved == (("persistent", 0, 1),)
    assert sm90.check(completion.config, _problem(256), H200) is None


def test_given_knobs_that_conflict_are_named_not_moved(sm90):
    """persistent=0 with q_stages=1 fails whatever the other knobs are: the error names that check only, not the
    scheduler's, which a moved default would mend."""
    with pytest.raises(ConfigError) as e:
        complete(sm90, {"persistent": 0, "q_stages": 1}, _problem(128), H200)
    message = str(e.value)
    assert message.startswith("sm90: persistent=0, q_stages=1 cannot run fp16-d128-full-b1-h8-n4096 on sm_90")
    assert "q_stages_persistent: " in message and "dynamic_scheduler" not in message
    assert message.endswith("change the given knobs (no value of the others mends it)")


def test_a_search_that_runs_out_of_its_budget_says_so(sm90, monkeypatch):
    """block_n=256 at d128: no K/V ring of 256 keys fits shared memory, with any other knob."""
    monkeypatch.setattr(complete_module, "MAX_COMPLETION_CHECKS", 40)
    with pytest.raises(ConfigError) as e:
        complete(sm90, {"block_n": 256}, _problem(128), H200)
    message = str(e.value)
    assert "block_n=256 cannot run" in message and "smem_fits: needs" in message
    assert "nor with the 40 nearest completions of the other knobs; give more knobs" in message


def test_conflicts_are_the_checks_the_given_knobs_fail_whatever_the_device(sm90):
    problem = _problem(128)
    assert conflicts(sm90, {"persistent": 0}, problem) == []  # the scheduler's default is mended, not a conflict
    assert [c.split(":")[0] for c in conflicts(sm90, {"persistent": 0, "q_stages": 1}, problem)] == [
        "q_stages_persistent"
    ]
    assert [c.split(":")[0] for c in conflicts(sm90, {"cta_mode": 2, "producer_regs": 24}, problem)] == [
        "producer_registers"
    ]
    assert conflicts(sm90, {"block_n": 256, "kv_stages": 4}, problem) == []  # shared memory: the device decides


# -- sm80 ---------------------------------------------------------------------------------------------------
def test_sm80_completions(sm80):
    problem = _problem(128)
    assert complete(sm80, {"block_m": 256}, problem, A100).moved == (("num_warps", 4, 8),)
    assert complete(sm80, {"pv_split": 64}, problem, A100).moved == (("block_m", 128, 64), ("block_n", 64, 128))


@pytest.mark.parametrize("family", ["sm80", "sm90"])
def test_defaults_that_run_are_taken_as_they_are(family):
    space = load_space(family)
    device = H200 if family == "sm90" else A100
    for head_dim in space.family.head_dims:
        completion = complete(space, {}, _problem(head_dim), device)
        assert completion.config == space.defaults(head_dim, device.arch)
        assert completion.moved == () and completion.note == ""


def test_a_problem_or_device_the_family_does_not_run_is_said_so_without_blaming_the_knobs(sm80, sm90):
    with pytest.raises(ConfigError) as e:
        complete(sm80, {"block_m": 64}, _problem(256), A100)
    assert str(e.value) == "sm80 cannot run fp16-d256-full-b1-h8-n4096 on sm_80 (A100, nominal): " + str(
        sm80.supports(_problem(256))
    )
    with pytest.raises(ConfigError, match=r"^sm90 cannot run .*built for sm_90a only") as e:
        complete(sm90, {"block_n": 64}, _problem(128), A100)
    assert "change the given knobs" not in str(e.value)
