"""A problem's inputs and float32 reference, made once per worker process and reused by every trial.

Drawing Q, K, V and computing the reference of every (batch, head) costs far more than checking
one kernel, so the worker keeps them for its last few problems (:class:`InputCache`), keyed by
(problem, input scale, the job's seed). The data also depend on a random salt drawn when the
cache is made, once per worker process: workers on other GPUs, and a worker restarted after a
fault, check on other data. A job that asks for fresh inputs gets data of its own, not kept.

A kernel that writes outside its outputs could corrupt kept inputs or reference and fail every
later trial of the problem: a job ends by comparing a checksum of every kept array with the one
taken when it was made (:meth:`ProblemData.intact`), and data that changed are dropped.

The cache and the seeds are plain Python (CPU-tested); :func:`make_problem_data` needs CuPy.
"""

from __future__ import annotations

import math
import secrets
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

__all__ = ["InputCache", "ProblemData", "check_rows", "make_problem_data", "softmax_scale"]

_FULL_CHECK_ELEMENTS = 1 << 28  # every row of every head when B*H*Nq*Nk is at most this, else strided rows
_MAX_ROW_STRIDE = 64  # one consumer warpgroup's rows: a strided check still sees every 64-row block

T = TypeVar("T")


def softmax_scale(problem) -> float:
    """The scale of Q K^T the kernels are launched with and the reference uses."""
    return 1.0 / math.sqrt(problem.head_dim)


def check_rows(batch: int, heads: int, seqlen_q: int, seqlen_k: int, rng: np.random.Generator) -> np.ndarray | None:
    """The query rows each (batch, head) is compared on: None for all of them, else every
    ``stride``-th row from a random offset, plus the last row.

    Every (batch, head) is always checked, so a kernel that computes some work units wrong
    (a scheduler or cluster bug) cannot pass on the units it gets right. The stride is the
    smallest power of two that keeps the reference within ``_FULL_CHECK_ELEMENTS``, at most
    ``_MAX_ROW_STRIDE``, so every block of 64 query rows has a row in the check.
    """
    stride = 1
    while batch * heads * math.ceil(seqlen_q / stride) * seqlen_k > _FULL_CHECK_ELEMENTS and stride < _MAX_ROW_STRIDE:
        stride *= 2
    if stride == 1:
        return None
    rows = np.arange(int(rng.integers(stride)), seqlen_q, stride)
    return np.union1d(rows, [seqlen_q - 1])


class InputCache(Generic[T]):
    """The data of the last ``capacity`` keys, made by ``build(problem, input_scale, data_seed)``."""

    def __init__(self, build: Callable[[Any, float, int], T], *, capacity: int = 2, salt: int | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        self.build = build
        self.capacity = capacity
        self.salt = secrets.randbits(63) if salt is None else salt
        self._entries: OrderedDict[Hashable, T] = OrderedDict()
        self._fresh = 0  # fresh data made so far: each gets a seed of its own

    def data_seed(self, seed: int, draw: int = 0) -> int:
        """The seed of the data for a job's ``seed``: differs between caches (processes) and between draws."""
        words = np.random.SeedSequence([abs(seed), int(seed < 0), self.salt, draw]).generate_state(2, np.uint32)
        return int(words[0]) << 32 | int(words[1])

    def get(self, problem, input_scale: float, seed: int, *, fresh: bool = False) -> tuple[T, bool]:
        """``(data, reused)``: the kept data of this key (reused) or new data, kept unless ``fresh``."""
        if fresh:
            self._fresh += 1
            return self.build(problem, input_scale, self.data_seed(seed, self._fresh)), False
        key = (problem, float(input_scale), seed)
        if key in self._entries:
            self._entries.move_to_end(key)
            return self._entries[key], True
        while len(self._entries) >= self.capacity:  # free the oldest before making the new one
            self._entries.popitem(last=False)
        data = self.build(problem, input_scale, self.data_seed(seed))
        self._entries[key] = data
        return data, False

    def discard(self, data: T) -> None:
        """Forget ``data`` (it may have been written over); the next job of its key makes new data."""
        for key in [k for k, v in self._entries.items() if v is data]:
            del self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)


@dataclass(eq=False)
class ProblemData:
    """Inputs of one problem on the GPU and their reference on the checked rows.

    ``q``: [B, Nq, Hq, D], ``k``, ``v``: [B, Nk, Hkv, D] in the 16-bit storage type; ``rows``: the
    query rows checked (None: all; see :func:`check_rows`); ``ref_o``: fp32 [B, R, Hq, D];
    ``ref_lse``: fp32 [B, Hq, R].
    """

    q: Any
    k: Any
    v: Any
    rows: np.ndarray | None
    ref_o: Any
    ref_lse: Any
    seed: int
    checksum: tuple[int, ...] = field(default=())

    def arrays(self) -> tuple:
        return self.q, self.k, self.v, self.ref_o, self.ref_lse

    def intact(self) -> bool:
        """Whether every array still holds what it held when it was made."""
        return _fingerprint(self.arrays()) == self.checksum


def _fingerprint(arrays) -> tuple[int, ...]:
    """A checksum per array: the wrapping sum of its elements' bits (one device sync for all)."""
    import cupy

    sums = [a.view(f"uint{8 * a.itemsize}").sum(dtype=cupy.uint64) for a in arrays]
    return tuple(int(s) for s in cupy.asnumpy(cupy.stack(sums)))


def make_problem_data(problem, input_scale: float, data_seed: int) -> ProblemData:
    """Random inputs of ``problem`` (standard normal times ``input_scale``) and their reference."""
    from ._reference import reference_problem
    from ._tensors import random_inputs

    p = problem
    q, k, v = random_inputs(p, data_seed, scale=input_scale)
    rows = check_rows(p.batch, p.heads_q, p.seqlen_q, p.seqlen_k, np.random.default_rng(data_seed))
    ref_o, ref_lse = reference_problem(q, k, v, p, softmax_scale(p), rows=rows)
    data = ProblemData(q=q, k=k, v=v, rows=rows, ref_o=ref_o, ref_lse=ref_lse, seed=data_seed)
    data.checksum = _fingerprint(data.arrays())
    return data
