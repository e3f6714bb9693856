"""A NumPy model of the sm90 softmax's rounding (kernel_src/sm90/softmax.cuh), to bound the O and LSE errors
of its two ways of producing P against a float64 reference.

``exp2_packed=False`` is today's path: x = s * scale_log2 - row_max in fp32, 2^x by MUFU.EX2 in fp32
(relative error ~2^-22, modelled as exact), the row sum in fp32, P rounded to 16 bits for O += P V.
``exp2_packed=True`` is knob exp2_packed's: x rounded to the 16-bit type, 2^x by the packed 16-bit
ex2 (its result anywhere within ``EX2_MAX_REL_ERROR`` of 2^x, uniformly, then rounded to the type),
and the row sum from those packed P: per tile and thread, each half of the pairs summed by a balanced
tree of 16-bit adds (HADD2) and converted to fp32 once (fp16); for bf16 the model sums the packed P in
fp32 (the best a bf16 kernel could do).

Each query row is one simulated row of a consumer thread quad: the tile's keys are spread over the
4 threads as the wgmma accumulator spreads them (thread t holds keys 8 j + 2 t and 8 j + 2 t + 1), the
key tiles run last first as in the kernel, and the lazy rescale adopts a new max only when it exceeds
the kept one by more than ``slack`` (per row: the kernel's warp-uniform rescale is only fresher).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["EX2_F16X2_NEEDED", "EX2_MAX_REL_ERROR", "Errors", "random_rows", "round16", "simulate"]

#: The PTX ISA's maximum relative error of ex2.approx on 16-bit types (Half Precision Floating Point
#: Instructions: ex2): 2^-9.9 for .f16/.f16x2, 2^-7 for .bf16/.bf16x2.
EX2_MAX_REL_ERROR = {"fp16": 2.0**-9.9, "bf16": 2.0**-7}
#: The error bound of ex2.approx.f16x2 under which peaked rows (input scale 3) keep the LSE inside the
#: fp16 tolerance with rescale_slack <= 2; tests/gpu/test_exp2_packed.py measures the hardware's.
EX2_F16X2_NEEDED = 2.0**-10.5
_HALF_ULP = {"fp16": 2.0**-11, "bf16": 2.0**-8}  # unit roundoff of each type


def round16(x, dtype: str) -> np.ndarray:
    """Round to the 16-bit type (to nearest even), returned as float32."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "fp16":
        return x.astype(np.float16).astype(np.float32)
    bits = np.ascontiguousarray(x).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32)


def _add16(a, b, dtype: str) -> np.ndarray:
    return round16(a.astype(np.float64) + b.astype(np.float64), dtype)


def _tree16(values: list, dtype: str) -> np.ndarray:
    """The balanced tree of 16-bit adds the kernel uses: neighbours first, in order."""
    while len(values) > 1:
        paired = [_add16(values[i], values[i + 1], dtype) for i in range(0, len(values) - 1, 2)]
        values = paired + ([values[-1]] if len(values) % 2 else [])
    return values[0]


@dataclass(frozen=True)
class Errors:
    o_rel_l2: float  # relative L2 error of O over all rows, as tuner/gpu/_measure.py checks a head
    lse_abs: float  # largest |LSE - reference| of a row (natural log)


def random_rows(rng: np.random.Generator, rows: int, keys: int, head_dim: int, dtype: str, scale: float):
    """Q, K, V as the GPU check makes them: standard normal times ``scale``, rounded to the type."""
    q, k, v = (round16(rng.standard_normal((n, head_dim)) * scale, dtype) for n in (rows, keys, keys))
    return q, k, v


def simulate(
    q,
    k,
    v,
    dtype: str,
    *,
    exp2_packed: bool,
    slack: int = 8,
    block_n: int = 128,
    rng=None,
    ex2_max_rel_error: float | None = None,
) -> Errors:
    """The errors of one head's O and LSE (non-causal) against float64. ``ex2_max_rel_error``: the packed
    ex2's error bound (None: the documented one, EX2_MAX_REL_ERROR; 0: correctly rounded)."""
    rng = rng if rng is not None else np.random.default_rng(0)
    rows, keys = q.shape[0], k.shape[0]
    scale = 1.0 / math.sqrt(q.shape[1])
    scale_log2 = np.float32(scale * math.log2(math.e))
    s = (q.astype(np.float64) @ k.astype(np.float64).T).astype(np.float32)  # wgmma: fp32 accumulate

    ref_logits = s.astype(np.float64) * scale
    ref_max = ref_logits.max(axis=1, keepdims=True)
    ref_w = np.exp(ref_logits - ref_max)
    ref_sum = ref_w.sum(axis=1)
    ref_o = (ref_w @ v.astype(np.float64)) / ref_sum[:, None]
    ref_lse = ref_max[:, 0] + np.log(ref_sum)

    row_max = np.full(rows, -np.inf, dtype=np.float32)
    lane_sum = np.zeros((rows, 4), dtype=np.float32)  # each quad thread's share of the row sum
    o = np.zeros((rows, v.shape[1]), dtype=np.float64)
    n_tiles = -(-keys // block_n)
    bound = EX2_MAX_REL_ERROR[dtype] if ex2_max_rel_error is None else ex2_max_rel_error
    extra = max(bound - _HALF_ULP[dtype], 0.0)  # beyond the final rounding
    for t in reversed(range(n_tiles)):
        cols = np.arange(t * block_n, min((t + 1) * block_n, keys))
        st = np.full((rows, block_n), -np.inf, dtype=np.float32)  # keys past the end: masked
        st[:, : len(cols)] = s[:, cols]
        mx = (st.max(axis=1) * scale_log2).astype(np.float32)
        need = mx > row_max + np.float32(slack)
        m = np.where(need, np.maximum(row_max, mx), row_max)
        o_scale = np.where(row_max == -np.inf, 0.0, np.exp2(np.where(need, row_max - m, 0.0))).astype(np.float32)
        o_scale = np.where(need, o_scale, 1.0).astype(np.float32)
        row_max = m
        lane_sum *= o_scale[:, None]
        o *= o_scale[:, None].astype(np.float64)
        neg_max = np.where(row_max == -np.inf, 0.0, -row_max).astype(np.float32)
        x = (st.astype(np.float64) * np.float64(scale_log2) + neg_max[:, None]).astype(np.float32)  # FFMA
        if exp2_packed:
            x16 = round16(x, dtype)
            u = rng.uniform(-extra, extra, size=x16.shape)
            p = round16(np.exp2(x16.astype(np.float64)) * (1.0 + u), dtype)
            for lane in range(4):
                lo = [p[:, 8 * j + 2 * lane] for j in range(block_n // 8)]
                hi = [p[:, 8 * j + 2 * lane + 1] for j in range(block_n // 8)]
                if dtype == "fp16":
                    lane_sum[:, lane] += _tree16(lo, dtype)
                    lane_sum[:, lane] += _tree16(hi, dtype)
                else:
                    for val in lo + hi:
                        lane_sum[:, lane] += val
        else:
            p32 = np.exp2(x.astype(np.float64)).astype(np.float32)
            for lane in range(4):
                for j in range(block_n // 8):
                    lane_sum[:, lane] += p32[:, 8 * j + 2 * lane]
                    lane_sum[:, lane] += p32[:, 8 * j + 2 * lane + 1]
            p = round16(p32, dtype)
        o += p[:, : len(cols)].astype(np.float64) @ v[cols].astype(np.float64)

    total = lane_sum.astype(np.float64).sum(axis=1).astype(np.float32)  # the quad's shuffles, fp32
    out = round16((o / total[:, None]).astype(np.float32), dtype)
    lse = (row_max.astype(np.float64) + np.log2(total.astype(np.float64))) * math.log(2.0)
    o_err = float(np.sqrt(((out - ref_o) ** 2).sum()) / np.sqrt((ref_o**2).sum()))
    return Errors(o_rel_l2=o_err, lse_abs=float(np.abs(lse - ref_lse).max()))
