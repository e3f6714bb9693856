"""Samplers by name, and the Optuna distributions of a space."""

from __future__ import annotations

from collections.abc import Callable

import optuna
from optuna.distributions import CategoricalDistribution

from .errors import FlashtuneError
from .space import Space

__all__ = ["SAMPLERS", "SamplerError", "distributions", "make_sampler"]


class SamplerError(FlashtuneError, ValueError):
    """Unknown sampler, or one whose dependencies are missing."""


def distributions(space: Space) -> dict[str, CategoricalDistribution]:
    """One categorical distribution per knob: knob values are discrete and unordered for the kernel."""
    return {k.name: CategoricalDistribution(list(k.values)) for k in space.knobs}


def _tpe(space: Space, seed: int | None) -> optuna.samplers.BaseSampler:
    # multivariate models knob interactions; constant liar keeps compile-ahead trials from being re-proposed
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


class ExhaustiveSampler(optuna.samplers.BruteForceSampler):
    """Optuna's BruteForceSampler without its ``study.stop()`` once every point is covered: that
    only works inside ``Study.optimize`` and raises in an ask/tell loop. Once the grid is covered it
    proposes points already evaluated, which the tuner answers from storage until it stops with
    "space exhausted"."""

    def after_trial(self, study, trial, state, values) -> None:
        pass


def _grid(space: Space, seed: int | None) -> optuna.samplers.BaseSampler:
    if space.size() > 20000:
        raise SamplerError(f"the grid sampler would enumerate {space.size()} points; use tpe or random")
    return ExhaustiveSampler(seed=seed)


SAMPLERS: dict[str, Callable[[Space, int | None], optuna.samplers.BaseSampler]] = {
    "tpe": _tpe,
    "random": _random,
    "gp": _gp,
    "grid": _grid,
}


def make_sampler(name: str, space: Space, seed: int | None = None) -> optuna.samplers.BaseSampler:
    if name not in SAMPLERS:
        raise SamplerError(f"unknown sampler {name!r}; choose one of {', '.join(SAMPLERS)}")
    return SAMPLERS[name](space, seed)
