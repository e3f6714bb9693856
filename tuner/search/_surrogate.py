"""A Gaussian-process surrogate whose kernel sees pairs of knobs: it ranks coupled moves and jumps.

The additive model (:mod:`._model`) cannot say that two changes pay only together. This one can:
its kernel is a sum over single knobs plus a sum over pairs of knobs (an additive kernel of
orders 1 and 2), each knob's similarity of two values being 1 when equal, and for an ordered knob
decaying with the index distance (neighbouring tile sizes behave alike). With ``s_k`` the
similarities of two configs, the kernel is ``c1 * e1(s) / K + c2 * e2(s) / (K choose 2)`` with
``e1 = sum s_k`` and ``e2 = sum_{j<k} s_j s_k = (e1**2 - sum s_k**2) / 2``: what a ridge regression
over one-hot effects and all their pairwise products would fit, at the cost of an n x n solve
(n the configs measured). The posterior mean and standard deviation of log TFLOPS feed
expected improvement; configs in flight count as observed for the variance (their results are
not known, where they are is), so a batch of proposals spreads out instead of piling up.

The pair share ``c2`` and the noise are picked by marginal likelihood on a small grid, refitted
as results arrive. A failed config counts as a little worse than the worst that ran. numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..space import Config, Space

__all__ = ["InteractionGP", "expected_improvement"]

FAILURE_PENALTY = 0.1  # log TFLOPS below the worst measured config that a failed one counts as
PAIR_SHARES = (0.15, 0.4, 0.7)  # candidate shares of the kernel's variance in pairs of knobs
NOISES = (0.02, 0.1, 0.3)  # candidate noise variances, in units of the standardized log TFLOPS
ORDERED_DECAY = 3.0  # an ordered knob's similarity of its two extreme values: exp(-ORDERED_DECAY)
MIN_SCALE = 0.01  # floor of the standard deviation that standardizes log TFLOPS


def _similarity(ordered: bool, size: int) -> np.ndarray:
    """size x size similarities of a knob's values: 1 on the diagonal; an ordered knob of 3 or more values
    decays with the index distance, any other is 0 off the diagonal."""
    if not ordered or size < 3:
        return np.eye(size)
    idx = np.arange(size)
    return np.exp(-ORDERED_DECAY * np.abs(idx[:, None] - idx[None, :]) / (size - 1))


class InteractionGP:
    """``predict(configs)`` ~ (mean, standard deviation) of log TFLOPS; see the module docstring."""

    def __init__(self, space: Space) -> None:
        self.names = [k.name for k in space.knobs if len(k.values) > 1]
        self._index = {k.name: {v: i for i, v in enumerate(k.values)} for k in space.knobs}
        self._sim = [_similarity(space.knob(n).ordered, len(space.knob(n).values)) for n in self.names]
        self._rows: list[np.ndarray] = []
        self._ys: list[float | None] = []  # log TFLOPS; None: failed
        self._fit: tuple | None = None
        self._hyper = (PAIR_SHARES[1], NOISES[1])
        self._fitted_at = 0

    @property
    def count(self) -> int:
        """Configs observed (failed ones included)."""
        return len(self._rows)

    def encode(self, configs: Sequence[Config]) -> np.ndarray:
        """Value indices, one row per config (knobs of one value left out)."""
        return np.array([[self._index[n][c[n]] for n in self.names] for c in configs], dtype=np.int64).reshape(
            len(configs), len(self.names)
        )

    def add(self, config: Config, tflops: float | None) -> None:
        """One result: TFLOPS, or None for a failed config."""
        self._rows.append(self.encode([config])[0])
        self._ys.append(math.log(tflops) if tflops else None)
        self._fit = None

    def kernel(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Kernel matrix between encoded configs ``a`` (p rows) and ``b`` (n rows), pair share as fitted."""
        return self._kernel(a, b, self._hyper[0])

    def _kernel(self, a: np.ndarray, b: np.ndarray, pair_share: float) -> np.ndarray:
        k = len(self.names)
        e1 = np.zeros((len(a), len(b)))
        sq = np.zeros((len(a), len(b)))
        for j, sim in enumerate(self._sim):
            s = sim[a[:, j][:, None], b[:, j][None, :]]
            e1 += s
            sq += s * s
        e2 = (e1 * e1 - sq) / 2
        return (1 - pair_share) * e1 / max(1, k) + pair_share * e2 / max(1, k * (k - 1) / 2)

    def _targets(self) -> np.ndarray:
        ran = [y for y in self._ys if y is not None]
        worst = min(ran) - FAILURE_PENALTY if ran else 0.0
        return np.array([worst if y is None else y for y in self._ys])

    def _solve(self) -> tuple:
        """(X, standardized y, mean, scale, Cholesky factor, alpha) for the current data and hyperparameters."""
        if self._fit is None:
            x = np.array(self._rows)
            y = self._targets()
            mean, scale = float(y.mean()), max(float(y.std()), MIN_SCALE)
            z = (y - mean) / scale
            if self.count >= 3 and (self.count < 40 or self.count - self._fitted_at >= 5):
                self._hyper = max(
                    ((p, s) for p in PAIR_SHARES for s in NOISES),
                    key=lambda h: _log_likelihood(self._kernel(x, x, h[0]), z, h[1]),
                )
                self._fitted_at = self.count
            chol = np.linalg.cholesky(self.kernel(x, x) + self._hyper[1] * np.eye(len(x)))
            alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, z))
            self._fit = (x, z, mean, scale, chol, alpha)
        return self._fit

    def predict(self, candidates: np.ndarray, pending: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Posterior (mean, std) of standardized log TFLOPS for encoded ``candidates``; ``pending`` (encoded
        configs in flight) shrink the variance near them. Before any result: mean 0, std 1."""
        if not self._rows:
            prior = np.zeros(len(candidates))
            if pending is None or not len(pending):
                return prior, np.ones(len(candidates))
            return prior, self._variance(candidates, pending, None)
        x, _, _, _, chol, alpha = self._solve()
        cross = self.kernel(candidates, x)
        mean = cross @ alpha
        if pending is not None and len(pending):
            return mean, self._variance(candidates, np.vstack([x, pending]), None)
        return mean, self._variance(candidates, x, chol, cross)

    def _variance(
        self, candidates: np.ndarray, x: np.ndarray, chol: np.ndarray | None, cross: np.ndarray | None = None
    ) -> np.ndarray:
        if chol is None:
            chol = np.linalg.cholesky(self.kernel(x, x) + self._hyper[1] * np.eye(len(x)))
        if cross is None:
            cross = self.kernel(candidates, x)
        v = np.linalg.solve(chol, cross.T)
        prior = 1.0  # the kernel of a config with itself: every similarity is 1
        return np.sqrt(np.maximum(prior - (v * v).sum(axis=0), 1e-12))

    def best(self) -> float:
        """The best standardized log TFLOPS observed (0 before any result)."""
        if not self._rows:
            return 0.0
        return float(self._solve()[1].max())


def _log_likelihood(gram: np.ndarray, z: np.ndarray, noise: float) -> float:
    try:
        chol = np.linalg.cholesky(gram + noise * np.eye(len(z)))
    except np.linalg.LinAlgError:
        return -math.inf
    w = np.linalg.solve(chol, z)
    return float(-0.5 * w @ w - np.log(np.diag(chol)).sum())


def expected_improvement(mean: np.ndarray, std: np.ndarray, best: float, xi: float = 0.01) -> np.ndarray:
    """Expected improvement over ``best`` of a normal (mean, std), elementwise."""
    gain = mean - best - xi
    u = gain / std
    cdf = 0.5 * (1 + np.vectorize(math.erf)(u / math.sqrt(2)))
    pdf = np.exp(-0.5 * u * u) / math.sqrt(2 * math.pi)
    return gain * cdf + std * pdf
