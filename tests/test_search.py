"""tuner.search: samplers by name and the distributions of a space."""

from __future__ import annotations

import importlib.util

import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from tests.conftest import family_params, toy_space_text
from tuner.search import SAMPLERS, SamplerError, distributions, make_sampler
from tuner.space import load_space

HAVE_GP_DEPS = all(importlib.util.find_spec(m) for m in ("torch", "scipy"))


def test_distributions_are_one_categorical_per_knob(toy_space):
    dists = distributions(toy_space)
    assert list(dists) == [k.name for k in toy_space.knobs]
    for k in toy_space.knobs:
        assert isinstance(dists[k.name], CategoricalDistribution)
        assert dists[k.name].choices == k.values


@pytest.mark.parametrize("space_path", family_params())
def test_distributions_of_every_family(space_path):
    space = load_space(space_path)
    dists = distributions(space)
    assert {n: d.choices for n, d in dists.items()} == {k.name: k.values for k in space.knobs}


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_every_sampler_builds_and_proposes_valid_configs(name, toy_space):
    if name == "gp" and not HAVE_GP_DEPS:
        with pytest.raises(SamplerError, match="PyTorch"):
            make_sampler(name, toy_space, 0)
        return
    sampler = make_sampler(name, toy_space, 0)
    assert isinstance(sampler, optuna.samplers.BaseSampler)
    study = optuna.create_study(sampler=sampler, direction="maximize")
    for _ in range(3):
        trial = study.ask(distributions(toy_space))
        assert toy_space.validate(trial.params) == trial.params
        study.tell(trial, float(sum(trial.params.values())))


@pytest.mark.parametrize("name", ["tpe", "random"])
def test_seeded_samplers_are_reproducible(name, toy_space):
    def proposals():
        study = optuna.create_study(sampler=make_sampler(name, toy_space, 42), direction="maximize")
        out = []
        for _ in range(10):
            trial = study.ask(distributions(toy_space))
            out.append(trial.params)
            study.tell(trial, float(trial.params["block_m"]))
        return out

    assert proposals() == proposals()


def test_unknown_sampler():
    with pytest.raises(SamplerError, match="unknown sampler 'cmaes'.*tpe"):
        make_sampler("cmaes", None, 0)  # type: ignore[arg-type]


def test_grid_refuses_a_huge_space(tmp_path):
    path = tmp_path / "toy.toml"
    text = toy_space_text()
    assert "values = [0, 1]\ndefault = 0" in text
    path.write_text(text.replace("values = [0, 1]\ndefault = 0", f"values = {list(range(1000))}\ndefault = 0"))
    space = load_space(path)
    assert space.size() == 27 * 1000 > 20000
    with pytest.raises(SamplerError, match="grid sampler would enumerate 27000"):
        make_sampler("grid", space, 0)
