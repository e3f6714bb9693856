"""Float32 reference attention for one (batch, head) or a whole problem, in row chunks.

On the GPU with CuPy arrays; the same code runs on NumPy arrays (the CPU tests check it there).
"""

from __future__ import annotations

import cupy

from ._tensors import to_float32

__all__ = ["masked_rows", "reference_head", "reference_problem"]


def masked_rows(seqlen_q: int, seqlen_k: int, causal: bool) -> int:
    """Number of leading query rows that see no key (bottom-right aligned causal mask)."""
    return max(0, seqlen_q - seqlen_k) if causal else 0


def reference_head(q, k, v, softmax_scale: float, causal: bool, *, rows=None, chunk_rows: int = 2048):
    """O (fp32, [R, D]) and natural-log LSE (fp32, [R]) for 2-D fp32 q [Nq, D], k and v [Nk, D]:
    every query row (R = Nq), or only the query rows whose indices ``rows`` lists, in its order.

    Pass the 16-bit inputs upcast to fp32; products accumulate in fp32 (no TF32).
    Rows that see no key get O = 0 and LSE = -inf.
    """
    xp = cupy.get_array_module(q)
    seqlen_q = q.shape[0]
    row_ids = xp.arange(seqlen_q) if rows is None else xp.asarray(rows)
    qf = xp.ascontiguousarray(q if rows is None else q[row_ids], dtype=xp.float32)
    kf, vf = (xp.ascontiguousarray(x, dtype=xp.float32) for x in (k, v))
    n_rows, seqlen_k = qf.shape[0], kf.shape[0]
    out = xp.empty((n_rows, vf.shape[1]), dtype=xp.float32)
    lse = xp.empty((n_rows,), dtype=xp.float32)
    cols = xp.arange(seqlen_k)[None, :]
    for r0 in range(0, n_rows, chunk_rows):
        r1 = min(n_rows, r0 + chunk_rows)
        s = (qf[r0:r1] @ kf.T) * xp.float32(softmax_scale)
        if causal:  # bottom-right aligned: row i sees keys j <= i + Nk - Nq
            s = xp.where(cols <= row_ids[r0:r1, None] + (seqlen_k - seqlen_q), s, xp.float32(-xp.inf))
        m = s.max(axis=1, keepdims=True)
        safe_m = xp.where(xp.isfinite(m), m, xp.float32(0.0))
        p = xp.exp(s - safe_m)
        l = p.sum(axis=1, keepdims=True)
        out[r0:r1] = xp.where(l > 0, (p @ vf) / xp.where(l > 0, l, xp.float32(1.0)), xp.float32(0.0))
        lse[r0:r1] = xp.where(
            l[:, 0] > 0, safe_m[:, 0] + xp.log(xp.where(l[:, 0] > 0, l[:, 0], xp.float32(1.0))), xp.float32(-xp.inf)
        )
    return out, lse


def reference_problem(q, k, v, problem, softmax_scale: float, *, rows=None):
    """The reference of every (batch, head) of ``problem`` from its 16-bit inputs (as :mod:`.tensors` stores
    them: q [B, Nq, Hq, D], k and v [B, Nk, Hkv, D]): O as fp32 [B, R, Hq, D] (the layout of the kernel's
    output) and LSE as fp32 [B, Hq, R], on every query row (R = Nq) or on the rows ``rows`` lists."""
    xp = cupy.get_array_module(q)
    p = problem
    n_rows = p.seqlen_q if rows is None else len(rows)
    out = xp.empty((p.batch, n_rows, p.heads_q, p.head_dim), dtype=xp.float32)
    lse = xp.empty((p.batch, p.heads_q, n_rows), dtype=xp.float32)
    group = p.heads_q // p.heads_kv
    for b in range(p.batch):
        for h_kv in range(p.heads_kv):
            kh, vh = (to_float32(x[b, :, h_kv], p.dtype) for x in (k, v))
            for h in range(h_kv * group, (h_kv + 1) * group):
                qh = to_float32(q[b, :, h], p.dtype)
                out[b, :, h], lse[b, h] = reference_head(qh, kh, vh, softmax_scale, p.causal, rows=rows)
    return out, lse
