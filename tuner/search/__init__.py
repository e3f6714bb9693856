"""Search strategies by name, and the distributions of a space's knobs in the stored study.

``--sampler NAME`` picks a :class:`Search`: ``pattern`` (the default) climbs from the family
default through ever wider neighbourhoods ranked by a surrogate (:mod:`._pattern`); ``tpe``,
``random`` and ``gp`` run an Optuna sampler in memory beside the stored study (:mod:`._optuna`);
``grid`` proposes every feasible config of a small space once (:mod:`._exhaustive`). Either way
only feasible configs nobody has taken reach the stored study; the tuner (:mod:`tuner.tune`) asks
for proposals and reports results.
"""

from __future__ import annotations

from collections.abc import Callable

import optuna
from optuna.distributions import CategoricalDistribution

from ..devices import DeviceLimits
from ..errors import FlashtuneError
from ..problem import Problem
from ..space import Space
from ._base import Search, SearchStats, nearest_feasible, neighbours
from ._exhaustive import GRID_LIMIT, ExhaustiveSearch
from ._optuna import OptunaSearch, search_distributions
from ._pattern import PatternSearch

__all__ = ["DEFAULT_SAMPLER", "SAMPLERS", "PatternSearch", "Search", "SearchStats", "SamplerError", "distributions",
           "make_sampler", "make_search", "nearest_feasible", "neighbours", "search_distributions"]

DEFAULT_SAMPLER = "pattern"


class SamplerError(FlashtuneError, ValueError):
    """Unknown sampler, or one whose dependencies are missing."""


def distributions(space: Space) -> dict[str, CategoricalDistribution]:
    """The stored study's distribution of each knob: its values, as categories (what a trial records;
    how a strategy searches them is its own business)."""
    return {k.name: CategoricalDistribution(list(k.values)) for k in space.knobs}


def _tpe(space: Space, seed: int | None) -> optuna.samplers.BaseSampler:
    # multivariate models knob interactions; constant liar keeps proposals in flight from being proposed again
    return optuna.samplers.TPESampler(multivariate=True, constant_liar=True, seed=seed, n_startup_trials=8)


def _random(space: Space, seed: int | None) -> optuna.samplers.BaseSampler:
    return optuna.samplers.RandomSampler(seed=seed)


def _gp(space: Space, seed: int | None) -> optuna.samplers.BaseSampler:
    try:
        import scipy  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        raise SamplerError("the gp sampler needs PyTorch and SciPy; install them or use --sampler tpe") from None
    return optuna.samplers.GPSampler(seed=seed)


def _grid(space: Space, seed: int | None) -> optuna.samplers.BaseSampler:
    if space.size() > GRID_LIMIT:
        raise SamplerError(f"the grid sampler would enumerate {space.size()} points; use tpe or random")
    return optuna.samplers.RandomSampler(seed=seed)  # the stored study's own sampler is never asked by the tuner


def _stored_only(space: Space, seed: int | None) -> optuna.samplers.BaseSampler:
    return optuna.samplers.RandomSampler(seed=seed)  # the stored study's own sampler is never asked by the tuner


#: name -> the Optuna sampler of the stored study (what an Optuna search runs in memory; for the others
#: a stand-in that the tuner never asks)
SAMPLERS: dict[str, Callable[[Space, int | None], optuna.samplers.BaseSampler]] = {
    "pattern": _stored_only,
    "tpe": _tpe,
    "random": _random,
    "gp": _gp,
    "grid": _grid,
}


def make_sampler(name: str, space: Space, seed: int | None = None) -> optuna.samplers.BaseSampler:
    """The Optuna sampler behind ``name`` (validates the name and its dependencies)."""
    if name not in SAMPLERS:
        raise SamplerError(f"unknown sampler {name!r}; choose one of {', '.join(SAMPLERS)}")
    return SAMPLERS[name](space, seed)


def make_search(name: str, space: Space, problem: Problem, device: DeviceLimits, seed: int | None = None) -> Search:
    """The search strategy ``--sampler name`` runs for ``problem`` on ``device``."""
    sampler = make_sampler(name, space, seed)
    if name == "grid":
        return ExhaustiveSearch(space, problem, device, seed)
    if name == "pattern":
        return PatternSearch(space, problem, device, seed)
    return OptunaSearch(space, problem, device, seed, sampler)
