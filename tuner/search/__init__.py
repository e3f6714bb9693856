"""Search strategies by name, and the distributions an Optuna sampler searches a space's knobs over.

``--sampler NAME`` picks a :class:`Search` from :data:`SEARCHES`, the one registry of search names:
``pattern`` (the default, :data:`DEFAULT_SEARCH`) climbs from the family default through ever wider
neighbourhoods ranked by a surrogate (:mod:`._pattern`); ``tpe``, ``random`` and ``gp`` run an Optuna
sampler in memory beside the stored study (:mod:`._optuna`); ``grid`` proposes every feasible config
of a small space once (:mod:`._exhaustive`). Either way only feasible configs nobody has taken reach
the stored study; the tuning loop (:mod:`tuner.run`) asks the search for proposals and reports
results, and never asks the stored study's own sampler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import optuna

from ..devices import DeviceLimits
from ..errors import FlashtuneError
from ..problem import Problem
from ..space import Space
from ._base import Search, SearchStats, nearest_feasible, neighbours
from ._exhaustive import GRID_LIMIT, ExhaustiveSearch
from ._optuna import OptunaSearch, search_distributions
from ._pattern import PatternSearch

__all__ = [
    "DEFAULT_SEARCH",
    "GRID_LIMIT",
    "SEARCHES",
    "OptunaSearch",
    "PatternSearch",
    "SamplerError",
    "Search",
    "SearchFactory",
    "SearchStats",
    "check_search",
    "make_sampler",
    "make_search",
    "nearest_feasible",
    "neighbours",
    "search_distributions",
]

#: the search ``--sampler`` runs unless told otherwise
DEFAULT_SEARCH = "pattern"


class SamplerError(FlashtuneError, ValueError):
    """Unknown search name, or one whose dependencies are missing or whose space is too large for it."""


def _runs_anywhere(space: Space) -> None:
    """The precondition of a search that any space and installation can run."""


@dataclass(frozen=True)
class SearchFactory:
    """How one named search is made: ``factory(space, problem, device, seed)`` builds it; ``check(space)``
    raises :class:`SamplerError` where this space or this installation cannot run it, and is all that
    runs before a GPU is found (:func:`check_search`)."""

    build: Callable[[Space, Problem, DeviceLimits, int | None], Search]
    check: Callable[[Space], None] = _runs_anywhere

    def __call__(self, space: Space, problem: Problem, device: DeviceLimits, seed: int | None = None) -> Search:
        self.check(space)
        return self.build(space, problem, device, seed)


def _optuna_search(sampler: Callable[[int | None], optuna.samplers.BaseSampler]) -> Callable[..., Search]:
    def build(space: Space, problem: Problem, device: DeviceLimits, seed: int | None) -> Search:
        return OptunaSearch(space, problem, device, seed, sampler(seed))

    return build


def _tpe(seed: int | None) -> optuna.samplers.BaseSampler:
    # multivariate models knob interactions; constant liar keeps proposals in flight from being proposed again
    return optuna.samplers.TPESampler(multivariate=True, constant_liar=True, seed=seed, n_startup_trials=8)


def _gp_dependencies(space: Space) -> None:
    try:
        import scipy  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        raise SamplerError("the gp sampler needs PyTorch and SciPy; install them or use --sampler tpe") from None


def _small_enough_for_grid(space: Space) -> None:
    if space.size() > GRID_LIMIT:
        raise SamplerError(f"the grid sampler would enumerate {space.size()} points; use tpe or random")


#: search name -> its factory: the names ``--sampler`` takes, each made one way
SEARCHES: dict[str, SearchFactory] = {
    "pattern": SearchFactory(PatternSearch),
    "tpe": SearchFactory(_optuna_search(_tpe)),
    "random": SearchFactory(_optuna_search(lambda seed: optuna.samplers.RandomSampler(seed=seed))),
    "gp": SearchFactory(_optuna_search(lambda seed: optuna.samplers.GPSampler(seed=seed)), _gp_dependencies),
    "grid": SearchFactory(ExhaustiveSearch, _small_enough_for_grid),
}


def _factory(name: str) -> SearchFactory:
    if name not in SEARCHES:
        raise SamplerError(f"unknown sampler {name!r}; choose one of {', '.join(SEARCHES)}")
    return SEARCHES[name]


def check_search(name: str, space: Space) -> None:
    """Refuse, before a GPU starts, a search name that :func:`make_search` would refuse for ``space``."""
    _factory(name).check(space)


def make_search(name: str, space: Space, problem: Problem, device: DeviceLimits, seed: int | None = None) -> Search:
    """The search ``--sampler name`` runs for ``problem`` on ``device``."""
    return _factory(name)(space, problem, device, seed)


def make_sampler(name: str, space: Space, seed: int | None = None) -> optuna.samplers.BaseSampler:
    """The sampler a stored study of search ``name`` is created with (checked as :func:`check_search` does).
    The tuning loop never asks it (proposals come from :func:`make_search`): a seeded random sampler,
    whatever the search."""
    check_search(name, space)
    return optuna.samplers.RandomSampler(seed=seed)
