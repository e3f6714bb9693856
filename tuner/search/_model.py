"""A small surrogate: log TFLOPS as a sum of per-knob-value effects, fitted by ridge regression.

It ranks the configs the pattern search is about to propose. One effect per (knob, value) makes
the fit a linear solve the size of all knob values together (65 for sm90), accumulated as results
arrive and solved again only when asked after a new one. A value never measured borrows from its
neighbours when its knob is ordered (between two measured values: the straight line between them;
beyond the measured ones: the last effect continued by :data:`TREND` of the last slope, so a
register budget that kept paying as it grew is tried a step further); otherwise it has no effect
(the shrinkage pulls it to the mean). A failed config (wrong result, compile error) counts as a
little worse than the worst that ran.
"""

from __future__ import annotations

import math

import numpy as np

from ..space import Config, Space

__all__ = ["TREND", "AdditiveModel"]

TREND = 0.5  # share of the last slope an ordered knob's effect continues beyond its measured values
FAILURE_PENALTY = 0.1  # log TFLOPS below the worst measured config that a failed one counts as


class AdditiveModel:
    """``predict(config)`` ~ log TFLOPS; ``ridge`` is the penalty on each effect (in units of one observation)."""

    def __init__(self, space: Space, *, ridge: float = 1.0) -> None:
        self.knobs = [k for k in space.knobs]
        self.columns: dict[tuple[str, int], int] = {}
        for k in self.knobs:
            for v in k.values:
                self.columns[(k.name, v)] = len(self.columns)
        n = len(self.columns)
        self.ridge = ridge
        self._gram = np.zeros((n, n))  # X^T X over ran and failed configs (one-hot rows)
        self._rhs = np.zeros(n)  # X^T y over the configs that ran
        self._failed = np.zeros(n)  # X^T 1 over the failed ones (their y is set at each fit)
        self._ys: list[float] = []
        self._failures = 0
        self._table: dict[str, dict[int, float]] | None = None
        self._mean = 0.0

    @property
    def count(self) -> int:
        """Configs that ran."""
        return len(self._ys)

    def _index(self, config: Config) -> list[int]:
        return [self.columns[(k.name, config[k.name])] for k in self.knobs]

    def add(self, config: Config, tflops: float) -> None:
        y = math.log(tflops)
        idx = self._index(config)
        self._gram[np.ix_(idx, idx)] += 1.0
        self._rhs[idx] += y
        self._ys.append(y)
        self._table = None

    def add_failure(self, config: Config) -> None:
        idx = self._index(config)
        self._gram[np.ix_(idx, idx)] += 1.0
        self._failed[idx] += 1.0
        self._failures += 1
        self._table = None

    def _fit(self) -> dict[str, dict[int, float]]:
        if self._table is None:
            failed_y = min(self._ys) - FAILURE_PENALTY
            n_rows = len(self._ys) + self._failures
            self._mean = (sum(self._ys) + failed_y * self._failures) / n_rows
            rhs = self._rhs + failed_y * self._failed - self._mean * np.diag(self._gram)  # centred y
            effects = np.linalg.solve(self._gram + self.ridge * np.eye(len(self.columns)), rhs)
            counts = np.diag(self._gram)
            self._table = {}
            for k in self.knobs:
                cols = [self.columns[(k.name, v)] for v in k.values]
                self._table[k.name] = dict(
                    zip(k.values, _fill(k.ordered, [float(effects[c]) for c in cols], [counts[c] > 0 for c in cols]))
                )
        return self._table

    def predict(self, config: Config) -> float:
        """Predicted log TFLOPS (0 before any config ran)."""
        if not self._ys:
            return 0.0
        table = self._fit()
        return self._mean + sum(table[k.name][config[k.name]] for k in self.knobs)

    def effect(self, name: str, value: int) -> float:
        """The effect of ``name = value`` on log TFLOPS (0: unknown, or average)."""
        return self._fit()[name][value] if self._ys else 0.0


def _fill(ordered: bool, effects: list[float], measured: list[bool]) -> list[float]:
    """Effects of an ordered knob's unmeasured values from its measured ones (see the module docstring)."""
    seen = [i for i, m in enumerate(measured) if m]
    if not ordered or not seen:
        return [e if m else 0.0 for e, m in zip(effects, measured)]
    out = []
    for here in range(len(effects)):
        if measured[here]:
            out.append(effects[here])
            continue
        below = [i for i in seen if i < here]
        above = [i for i in seen if i > here]
        if below and above:
            lo, hi = below[-1], above[0]
            out.append(effects[lo] + (effects[hi] - effects[lo]) * (here - lo) / (hi - lo))
            continue
        side = below[::-1] if below else above  # nearest first
        a = side[0]
        if len(side) == 1:
            out.append(effects[a])
        else:
            b = side[1]
            out.append(effects[a] + TREND * (effects[a] - effects[b]) * abs(here - a) / abs(a - b))
    return out
