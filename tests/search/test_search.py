"""tuner.search: searches by name (one registry), the stored study's sampler, and the distributions a search runs over."""

from __future__ import annotations

import importlib.util

import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from tests.conftest import toy_space_text
from tuner.search import DEFAULT_SEARCH, GRID_LIMIT, SEARCHES, SamplerError, check_search, make_sampler, make_search
from tuner.space import load_space
from tuner.study import knob_distributions

HAVE_GP_DEPS = all(importlib.util.find_spec(m) for m in ("torch", "scipy"))


@pytest.mark.parametrize("name", sorted(SEARCHES))
def test_every_sampler_builds_and_proposes_valid_configs(name, toy_space):
    if name == "gp" and not HAVE_GP_DEPS:
        with pytest.raises(SamplerError, match="PyTorch"):
            make_sampler(name, toy_space, 0)
        return
    sampler = make_sampler(name, toy_space, 0)
    assert isinstance(sampler, optuna.samplers.BaseSampler)
    study = optuna.create_study(sampler=sampler, direction="maximize")
    for _ in range(3):
        trial = study.ask(knob_distributions(toy_space, {}))
        assert toy_space.validate(trial.params) == trial.params
        study.tell(trial, float(sum(trial.params.values())))


@pytest.mark.parametrize("name", ["tpe", "random"])
def test_seeded_samplers_are_reproducible(name, toy_space):
    def proposals():
        study = optuna.create_study(sampler=make_sampler(name, toy_space, 42), direction="maximize")
        out = []
        for _ in range(10):
            trial = study.ask(knob_distributions(toy_space, {}))
            out.append(trial.params)
            study.tell(trial, float(trial.params["block_m"]))
        return out

    assert proposals() == proposals()


def test_unknown_sampler(toy_space, problem):
    with pytest.raises(SamplerError, match=r"unknown sampler 'cmaes'.*tpe"):
        make_sampler("cmaes", None, 0)  # type: ignore[arg-type]
    with pytest.raises(SamplerError, match=r"unknown sampler 'cmaes'.*tpe"):
        make_search("cmaes", toy_space, problem, _limits(), 0)
    with pytest.raises(SamplerError, match=r"unknown sampler 'cmaes'.*tpe"):
        check_search("cmaes", toy_space)


@pytest.mark.parametrize("name", sorted(SEARCHES))
def test_every_search_name_builds_its_strategy_which_proposes_feasible_configs(name, toy_space, problem):
    from tuner.search import OptunaSearch, PatternSearch, Search
    from tuner.search._exhaustive import ExhaustiveSearch

    if name == "gp" and not HAVE_GP_DEPS:
        with pytest.raises(SamplerError, match="PyTorch"):
            check_search(name, toy_space)
        return
    search = make_search(name, toy_space, problem, _limits(), 0)
    expected = {"pattern": PatternSearch, "grid": ExhaustiveSearch}.get(name, OptunaSearch)
    assert isinstance(search, Search) and type(search) is expected
    config = search.propose(set())
    assert config is not None and toy_space.check(config, problem, _limits()) is None


def test_the_default_search_and_the_cli_choices_come_from_the_registry():
    from tuner.cli._main import build_parser

    assert DEFAULT_SEARCH == "pattern" and DEFAULT_SEARCH in SEARCHES
    tune = build_parser()._subparsers._group_actions[0].choices["tune"]
    [sampler] = [a for a in tune._actions if "--sampler" in a.option_strings]
    assert sorted(sampler.choices) == sorted(SEARCHES) and sampler.default == DEFAULT_SEARCH


@pytest.mark.parametrize("name", ["tpe", "random", "pattern"])
def test_a_seeded_search_proposes_the_same_configs(name, toy_space, problem):
    from tuner.space import config_key

    def proposals():
        search, out = make_search(name, toy_space, problem, _limits(), 42), []
        for _ in range(8):
            config = search.propose({config_key(c) for c in out})
            if config is None:
                break
            out.append(config)
            search.observe(config, float(config["block_m"]))
        return out

    assert proposals() == proposals()


def test_grid_refuses_a_huge_space(tmp_path):
    path = tmp_path / "toy.toml"
    text = toy_space_text()
    assert "values = [0, 1]\ndefault = 0" in text
    path.write_text(text.replace("values = [0, 1]\ndefault = 0", f"values = {list(range(3000))}\ndefault = 0"))
    space = load_space(path)
    assert space.size() == 27 * 3000 > GRID_LIMIT
    with pytest.raises(SamplerError, match="grid sampler would enumerate 81000"):
        make_sampler("grid", space, 0)
    with pytest.raises(SamplerError, match="grid sampler would enumerate 81000"):
        check_search("grid", space)


# -- the search strategies the tuner runs (tuner.search.make_search) ------------------------------
def _limits():
    from tuner.devices import limits_for_arch

    return limits_for_arch(80)


def test_ordered_knobs_are_searched_as_value_indices_and_categories_stay_categories(tmp_path):
    from tuner.search import search_distributions

    text = toy_space_text().replace('help = "K/V ring depth"', 'help = "K/V ring depth"\nordered = false', 1)
    assert "ordered = false" in text
    (tmp_path / "toy.toml").write_text(text)
    space = load_space(tmp_path / "toy.toml")
    dists = search_distributions(space)
    assert dists["block_m"] == optuna.distributions.IntDistribution(0, 2)  # 32, 64, 128 as steps 0, 1, 2
    assert dists["stages"] == CategoricalDistribution([1, 2, 3])


def test_a_space_file_says_ordered_with_a_boolean(tmp_path):
    from tuner.space import SpaceError

    (tmp_path / "toy.toml").write_text(
        toy_space_text().replace('help = "K/V ring depth"', 'help = "K/V ring depth"\nordered = 1', 1)
    )
    with pytest.raises(SpaceError, match="ordered must be true"):
        load_space(tmp_path / "toy.toml")


def test_the_exhaustive_search_proposes_every_feasible_config_once_in_a_seeded_order(toy_space, problem):
    from tuner.search import make_search
    from tuner.space import config_key

    def sweep(seed):
        search = make_search("grid", toy_space, problem, _limits(), seed)
        out, taken = [], set()
        while (config := search.propose(taken)) is not None:
            out.append(config)
            taken.add(config_key(config))
        return out

    first = sweep(1)
    feasible = [c for c in first if toy_space.check(c, problem, _limits()) is None]
    assert first == feasible and len({config_key(c) for c in first}) == len(first)
    everything = [
        dict(zip(("block_m", "block_n", "stages", "flag"), v))
        for v in __import__("itertools").product((32, 64, 128), (32, 64, 128), (1, 2, 3), (0, 1))
    ]
    assert len(first) == sum(toy_space.check(c, problem, _limits()) is None for c in everything) < len(everything)
    assert sweep(1) == first and sweep(2) != first


@pytest.mark.parametrize("name", ["tpe", "random"])
def test_an_optuna_search_proposes_only_feasible_untaken_configs_and_learns(name, toy_space, problem):
    from tuner.search import make_search
    from tuner.space import config_key

    search = make_search(name, toy_space, problem, _limits(), 3)
    taken: set[str] = set()
    for _ in range(25):
        config = search.propose(taken)
        if config is None:
            break
        assert toy_space.check(config, problem, _limits()) is None and config_key(config) not in taken
        taken.add(config_key(config))
        search.observe(config, float(config["block_m"] + config["block_n"]))
    assert len(taken) >= 10
    assert search.stats.asks >= len(taken) and set(search.results) == taken


def test_neighbours_are_nearest_first_with_ordered_steps(toy_space):
    import random

    from tuner.search import neighbours

    config = {"block_m": 64, "block_n": 64, "stages": 2, "flag": 0}
    near = neighbours(toy_space, config, random.Random(0))
    assert all(sum(a != config[k] for k, a in n.items()) == 1 for n in near)
    two_steps = [n for n in near if n["block_m"] != 64 and abs((32, 64, 128).index(n["block_m"]) - 1) > 1]
    assert not two_steps  # 32 and 128 are one step from 64
    far = {"block_m": 32, "block_n": 64, "stages": 2, "flag": 0}
    from_32 = neighbours(toy_space, far, random.Random(0))
    assert from_32.index({**far, "block_m": 64}) < from_32.index({**far, "block_m": 128})


def test_nearest_feasible_repairs_an_infeasible_config_with_the_fewest_changes(toy_space, problem):
    from tuner.search import make_search, nearest_feasible

    search = make_search("random", toy_space, problem, _limits(), 0)
    infeasible = {"block_m": 64, "block_n": 128, "stages": 3, "flag": 0}  # too much shared memory on sm_80
    assert toy_space.check(infeasible, problem, _limits()) is not None
    repaired = nearest_feasible(search, infeasible, set())
    assert repaired is not None and toy_space.check(repaired, problem, _limits()) is None
    assert sum(repaired[k] != v for k, v in infeasible.items()) == 1
