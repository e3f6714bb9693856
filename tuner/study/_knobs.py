"""How a study stores its knobs: the Optuna distribution each trial's parameters are recorded with.

Studies created by this version record ``KNOB_ENCODING = "steps"``: an ordered knob (block sizes,
budgets, depths: :attr:`tuner.space.Knob.ordered`) is stored as an :class:`IntDistribution` over its
values' range, so Optuna's tools (optuna-dashboard, ``optuna.visualization``) draw its values on a
numeric axis, in order; a categorical knob stays a :class:`CategoricalDistribution` in its declared
order. Studies without the attribute (made before it) keep storing every knob as categorical: Optuna
refuses a parameter whose distribution differs from the one the study already stored, so they resume
as they were, with nothing rewritten.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from ..space import Knob, Space
from ._attributes import KNOB_ENCODING

__all__ = ["STEPS", "knob_distribution", "knob_distributions"]

#: the value of ``KNOB_ENCODING`` for ordered knobs stored as integers
STEPS = "steps"


def knob_distribution(knob: Knob, encoding: str | None) -> BaseDistribution:
    """The distribution ``knob`` is stored with under ``encoding`` (None: a study made before encodings)."""
    if encoding == STEPS and knob.ordered:
        low, high = min(knob.values), max(knob.values)
        step = math.gcd(*(v - low for v in knob.values)) or 1  # every value lies on the grid low + i * step
        return IntDistribution(low, high, step=step)
    return CategoricalDistribution(list(knob.values))


def knob_distributions(space: Space, study_attrs: Mapping[str, Any]) -> dict[str, BaseDistribution]:
    """Each knob's stored distribution, for the study whose user attributes are ``study_attrs``."""
    encoding = study_attrs.get(KNOB_ENCODING)
    return {k.name: knob_distribution(k, encoding) for k in space.knobs}
