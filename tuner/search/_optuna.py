"""An Optuna sampler (TPE, random, GP) searching in an in-memory study beside the stored one.

The sampler sees every finished trial of the stored study (:meth:`OptunaSearch.observe`) and
draws from its own in-memory study, so what it proposes that the static check rejects, or that
was evaluated already, costs no storage round trip: an infeasible draw is told PRUNED there (the
sampler learns to avoid the region) and repaired to the nearest feasible config that nobody has
taken; a repeat is told FAIL there (ignored, so a converged sampler does not pile weight on one
point) and drawn again. Ordered knobs (the space file's default) are searched as the index of
their value, so the sampler's model knows that 128 lies between 112 and 144; unordered knobs
as categories.
"""

from __future__ import annotations

from collections.abc import Set

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import Trial, TrialState

from ..devices import DeviceLimits
from ..problem import Problem
from ..space import Config, Space, config_key
from ._base import Search, nearest_feasible

__all__ = ["OptunaSearch", "search_distributions"]


def search_distributions(space: Space) -> dict[str, BaseDistribution]:
    """What the sampler draws per knob: an ordered knob's value index, an unordered knob's value."""
    return {
        k.name: IntDistribution(0, len(k.values) - 1)
        if k.ordered and len(k.values) > 1
        else CategoricalDistribution(list(k.values))
        for k in space.knobs
    }


class OptunaSearch(Search):
    """See the module docstring. ``repeat_limit`` repeats in a row: the sampler has converged, and
    :meth:`propose` returns None so the tuner explores."""

    def __init__(
        self,
        space: Space,
        problem: Problem,
        device: DeviceLimits,
        seed: int | None,
        sampler: optuna.samplers.BaseSampler,
        *,
        repeat_limit: int = 3,
    ) -> None:
        super().__init__(space, problem, device, seed)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._study = optuna.create_study(
            storage=optuna.storages.InMemoryStorage(), sampler=sampler, direction="maximize"
        )
        self._dists = search_distributions(space)
        self._open: dict[str, Trial] = {}  # proposals not settled yet: config key -> in-memory trial
        self.repeat_limit = repeat_limit

    # -- value <-> what the sampler draws ----------------------------------------------------
    def _encode(self, config: Config) -> dict[str, int]:
        return {
            k.name: k.values.index(config[k.name])
            if isinstance(self._dists[k.name], IntDistribution)
            else config[k.name]
            for k in self.space.knobs
        }

    def _decode(self, params: dict[str, int]) -> Config:
        return {
            k.name: k.values[params[k.name]] if isinstance(self._dists[k.name], IntDistribution) else params[k.name]
            for k in self.space.knobs
        }

    # -- Search ----------------------------------------------------------------------------
    def _learn(self, config: Config, value: float | None) -> None:
        trial = self._open.pop(config_key(config), None)
        state = TrialState.COMPLETE if value is not None else TrialState.PRUNED
        if trial is not None:
            self._study.tell(trial, value) if value is not None else self._study.tell(trial, state=state)
        else:
            self._study.add_trial(
                optuna.trial.create_trial(
                    params=self._encode(config), distributions=self._dists, value=value, state=state
                )
            )

    def withdraw(self, config: Config) -> None:
        trial = self._open.pop(config_key(config), None)
        if trial is not None:
            self._study.tell(trial, state=TrialState.FAIL)

    def propose(self, taken: Set[str]) -> Config | None:
        repeats = 0
        while repeats < self.repeat_limit:
            trial = self._study.ask(self._dists)
            self.stats.asks += 1
            config = self._decode(trial.params)
            key = config_key(config)
            if key in taken or key in self._open or key in self.results:
                self.stats.repeats += 1
                repeats += 1
                self._study.tell(trial, state=TrialState.FAIL)
                continue
            if self.feasible(config):
                self._open[key] = trial
                return config
            self.stats.infeasible += 1
            self._study.tell(trial, state=TrialState.PRUNED)
            repaired = nearest_feasible(self, config, {*taken, *self._open, *self.results})
            if repaired is not None:
                self._study.enqueue_trial(self._encode(repaired))
                trial = self._study.ask(self._dists)
                self._open[config_key(repaired)] = trial
                return repaired
        return None
