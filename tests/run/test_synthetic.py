"""tuner.synthetic: made-up landscapes over real spaces, as replay oracles."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from tuner.devices import limits_for_arch
from tuner.problem import Problem
from tuner.run import ReplayError, additive, feasible_configs, landscapes, planted, replay, replay_one, summarize
from tuner.run._synthetic import main
from tuner.space import config_key, load_space

H200 = limits_for_arch(90)
SM90_SMALL = Path(__file__).resolve().parents[1] / "data" / "sm90_small.toml"


@pytest.fixture(scope="module")
def sm80_d64():
    space = load_space("sm80")
    problem = Problem(batch=4, seqlen_q=1024, heads_q=16, head_dim=64, causal=False)
    return space, problem, list(feasible_configs(space, problem, H200))


def _shares(oracle, configs):
    return {config_key(c): (oracle.tflops(c) or 0.0) / oracle.best for c in configs}


@pytest.mark.parametrize("far", [False, True])
def test_a_planted_landscape_peaks_at_its_planted_best_with_the_default_good_but_not_best(sm80_d64, far):
    space, problem, configs = sm80_d64
    for seed in range(4):
        oracle = planted(space, problem, H200, seed, far=far)
        shares = _shares(oracle, configs)
        best = max(shares, key=shares.get)
        assert shares[best] == pytest.approx(1.0) and sorted(shares.values())[-2] < 1.0
        default = space.defaults(problem.head_dim)
        assert 0.85 < shares[config_key(default)] < 0.975  # the range, less noise
        centre = oracle.landscape.basins[0].centre
        planted_best = {n: space.knob(n).values[i] for n, i in zip(oracle.landscape.knob_names, centre)}
        assert config_key({**default, **planted_best}) == best
        changed = sum(default[n] != v for n, v in planted_best.items())
        assert (changed >= len(centre) // 2) if far else (2 <= changed <= 4)
        assert sum(s >= 0.99 for s in shares.values()) < len(configs) / 20  # a few, not a plateau


def test_an_additive_landscape_knows_its_best_by_enumeration(sm80_d64):
    space, problem, configs = sm80_d64
    for seed in range(3):
        oracle = additive(space, problem, H200, seed)
        shares = _shares(oracle, configs)
        assert max(shares.values()) == pytest.approx(1.0)
        assert 0.9 < shares[config_key(space.defaults(problem.head_dim))] <= 0.975 + 1e-9
        spread = [math.log(s) for s in shares.values()]
        assert 0.03 < (sum(x * x for x in spread) / len(spread) - (sum(spread) / len(spread)) ** 2) ** 0.5 < 0.3


def test_landscapes_are_fixed_by_their_seed_and_differ_between_seeds(sm80_d64):
    space, problem, configs = sm80_d64
    sample = configs[::50]
    for make in (planted, additive):
        one, again, two = (make(space, problem, H200, seed) for seed in (1, 1, 2))
        assert [one.tflops(c) for c in sample] == [again.tflops(c) for c in sample]
        assert [one.tflops(c) for c in sample] != [two.tflops(c) for c in sample]


def test_failures_strike_a_share_of_configs_never_the_default_or_the_best(sm80_d64):
    space, problem, configs = sm80_d64
    oracle = planted(space, problem, H200, 0, failures=0.2)
    failed = [c for c in configs if oracle.tflops(c) is None]
    assert 0.1 * len(configs) < len(failed) < 0.3 * len(configs)
    assert oracle.tflops(space.defaults(problem.head_dim)) is not None
    assert max(oracle.tflops(c) or 0.0 for c in configs) == pytest.approx(oracle.best)


def test_the_huge_sm90_space_is_computed_lazily_with_its_real_static_check():
    space = load_space("sm90")
    assert space.size() > 10_000_000
    problem = Problem(batch=2, seqlen_q=8192, heads_q=16, head_dim=256, causal=True)
    oracle = planted(space, problem, H200, 0)
    default = space.defaults(256)
    assert 0.85 < oracle.tflops(default) / oracle.best < 0.975
    rng = random.Random(0)
    for _ in range(300):
        config = {k.name: rng.choice(k.values) for k in space.knobs}
        if space.check(config, problem, H200) is None:
            assert oracle.tflops(config) <= oracle.best
        else:
            with pytest.raises(ReplayError, match="infeasible"):
                oracle.tflops(config)
    with pytest.raises(ReplayError, match="enumerating"):
        next(feasible_configs(space, problem, H200))
    assert "planted landscape" in oracle.describe() and "default 0.9" in oracle.describe()


def test_where_uniform_draws_find_no_feasible_config_a_random_walk_from_the_default_does():
    """The whole sm90 space at head dim 256 (a few feasible configs in 100,000 draws): with 50 draws allowed,
    rejection finds none, and the walk from the default ends on feasible configs that the landscape's test
    accepts, different ones for different seeds, the same for the same seed."""
    from tuner.run._synthetic import _random_feasible

    space = load_space("sm90")
    problem = Problem(batch=2, seqlen_q=8192, heads_q=16, head_dim=256, causal=True)
    default = space.defaults(256)
    names = [k.name for k in space.knobs if len(k.values) > 1]

    def far(c):
        return sum(c[n] != default[n] for n in names) >= 3

    drawn = [_random_feasible(space, problem, H200, random.Random(seed), accept=far, tries=50) for seed in range(4)]
    for config in drawn:
        assert space.check(config, problem, H200) is None and far(config)
    assert len({config_key(c) for c in drawn}) > 1
    again = _random_feasible(space, problem, H200, random.Random(0), accept=far, tries=50)
    assert config_key(again) == config_key(drawn[0])
    rng = random.Random(0)  # the 50 uniform draws alone: none feasible, so the walk above was taken
    assert all(
        space.check({k.name: rng.choice(k.values) for k in space.knobs}, problem, H200) is not None for _ in range(50)
    )


def test_a_synthetic_oracle_replays_through_the_tuning_loop():
    space = load_space(SM90_SMALL)
    problem = Problem(batch=4, seqlen_q=512, heads_q=16, head_dim=128, causal=False)
    oracle = planted(space, problem, H200, 5)
    run = replay_one(oracle, "pattern", seed=0, budget=20)
    assert len(run.values) == 20 and run.values[0] == oracle.tflops(space.defaults(128))
    assert run.best == oracle.best and run.repeats == 0
    runs = replay(landscapes("additive", space, problem, H200), ["pattern", "grid"], range(2), 10, jobs=2)
    rows = summarize(None, runs)
    assert [r["sampler"] for r in rows] == ["pattern", "grid"] and all(r["runs"] == 2 for r in rows)
    with pytest.raises(ReplayError, match="unknown landscape kind"):
        landscapes("flat", space, problem, H200)


def test_the_synthetic_command_prints_a_table_and_markdown(capsys):
    args = [
        "--space",
        str(SM90_SMALL),
        "--kind",
        "planted",
        "--samplers",
        "pattern,grid",
        "--seeds",
        "2",
        "--budget",
        "12",
        "--full",
        "--seqlen",
        "1024",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "planted landscapes over sm90_small: fp16-d128-full-b4-h16-n1024" in out
    assert [line.split()[0] for line in out.splitlines()[3:]] == ["pattern", "grid"]
    assert main([*args, "--markdown"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert len(rows) == 2 and rows[0].startswith("| planted sm90_small") and "| pattern |" in rows[0]
