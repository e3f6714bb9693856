"""Float32 reference attention for one (batch, head), on the GPU with CuPy, in row chunks."""

from __future__ import annotations

import cupy

__all__ = ["reference_head", "masked_rows"]


def masked_rows(seqlen_q: int, seqlen_k: int, causal: bool) -> int:
    """Number of leading query rows that see no key (bottom-right aligned causal mask)."""
    return max(0, seqlen_q - seqlen_k) if causal else 0


def reference_head(q, k, v, softmax_scale: float, causal: bool, *, rows=None, chunk_rows: int = 2048):
    """O (fp32, [R, D]) and natural-log LSE (fp32, [R]) for 2-D fp32 q [Nq, D], k and v [Nk, D]:
    every query row (R = Nq), or only the query rows whose indices ``rows`` lists, in its order.

    Pass the 16-bit inputs upcast to fp32; products accumulate in fp32 (no TF32).
    Rows that see no key get O = 0 and LSE = -inf.
    """
    seqlen_q = q.shape[0]
    row_ids = cupy.arange(seqlen_q) if rows is None else cupy.asarray(rows)
    qf = cupy.ascontiguousarray(q if rows is None else q[row_ids], dtype=cupy.float32)
    kf, vf = (cupy.ascontiguousarray(x, dtype=cupy.float32) for x in (k, v))
    n_rows, seqlen_k = qf.shape[0], kf.shape[0]
    out = cupy.empty((n_rows, vf.shape[1]), dtype=cupy.float32)
    lse = cupy.empty((n_rows,), dtype=cupy.float32)
    cols = cupy.arange(seqlen_k)[None, :]
    for r0 in range(0, n_rows, chunk_rows):
        r1 = min(n_rows, r0 + chunk_rows)
        s = (qf[r0:r1] @ kf.T) * cupy.float32(softmax_scale)
        if causal:  # bottom-right aligned: row i sees keys j <= i + Nk - Nq
            s = cupy.where(cols <= row_ids[r0:r1, None] + (seqlen_k - seqlen_q), s, -cupy.inf)
        m = s.max(axis=1, keepdims=True)
        safe_m = cupy.where(cupy.isfinite(m), m, 0.0)
        p = cupy.exp(s - safe_m)
        l = p.sum(axis=1, keepdims=True)
        out[r0:r1] = cupy.where(l > 0, (p @ vf) / cupy.where(l > 0, l, 1.0), 0.0)
        lse[r0:r1] = cupy.where(l[:, 0] > 0, safe_m[:, 0] + cupy.log(cupy.where(l[:, 0] > 0, l[:, 0], 1.0)), -cupy.inf)
    return out, lse
