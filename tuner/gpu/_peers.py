"""Peers timed in the same run as a flashtune kernel: PyTorch SDPA backends and a large cuBLAS GEMM.

Runs in the GPU worker (:meth:`.CupyHandler.run_peers`). Needs PyTorch; a backend that refuses the
shape is reported, not fatal. Timed by :func:`._timing.time_kernel`, the method flashtune's kernels are
timed with (PyTorch launches on the legacy default stream, CuPy's current stream here, so the events
frame them).
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection

from ..problem import Problem
from ._jobs import GEMM_COOLDOWN_S, GEMM_PEER, PEER_NAMES, MeasureSettings
from ._stopping import TimingStats
from ._timing import time_kernel

__all__ = ["SDPA_BACKENDS", "time_peers"]

SDPA_BACKENDS = tuple(name.removeprefix("sdpa_").upper() for name in PEER_NAMES if name.startswith("sdpa_"))


def time_peers(
    problem: Problem, settings: MeasureSettings | None = None, names: Collection[str] | None = None
) -> list[dict[str, object]]:
    """Rows ``{"name", "latency_ms", "tflops", "detail"}`` (and the timing's figures when timed), one per peer of
    ``names`` (default: :data:`PEER_NAMES`, all), in :data:`PEER_NAMES`' order. After the GEMM the card idles
    :data:`GEMM_COOLDOWN_S`, so that whatever is timed next does not run on its lowered clocks."""
    unknown = set(names or ()) - set(PEER_NAMES)
    if unknown:
        raise ValueError(f"unknown peers {sorted(unknown)}; the peers are {', '.join(PEER_NAMES)}")
    wanted = set(PEER_NAMES if names is None else names)
    settings = settings or MeasureSettings()
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401 (what _time_sdpa needs, checked here)
    except ImportError:
        return [{"name": "pytorch", "latency_ms": None, "tflops": None, "detail": "PyTorch is not installed"}]
    p = problem
    dtype = getattr(torch, p.dtype_spec.torch_name)
    gen = torch.Generator(device="cuda").manual_seed(settings.seed + 1)
    # [B, N, H, D] storage viewed as [B, H, N, D], the layout flashtune kernels read
    q = torch.randn(p.batch, p.seqlen_q, p.heads_q, p.head_dim, device="cuda", dtype=dtype, generator=gen).transpose(
        1, 2
    )
    k = torch.randn(p.batch, p.seqlen_k, p.heads_kv, p.head_dim, device="cuda", dtype=dtype, generator=gen).transpose(
        1, 2
    )
    v = torch.randn(p.batch, p.seqlen_k, p.heads_kv, p.head_dim, device="cuda", dtype=dtype, generator=gen).transpose(
        1, 2
    )
    rows: list[dict[str, object]] = []
    for backend in SDPA_BACKENDS:
        if f"sdpa_{backend.lower()}" in wanted:
            rows.append(_time_sdpa(backend, p, q, k, v, settings))
    if GEMM_PEER in wanted:
        rows.append(_time_gemm(torch, dtype, gen, settings))
    return rows


def _time_sdpa(backend: str, p: Problem, q, k, v, settings: MeasureSettings) -> dict[str, object]:
    """One SDPA backend's row on ``q``, ``k``, ``v`` ([B, H, N, D] views); a backend that refuses the shape says why."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    name = f"sdpa_{backend.lower()}"
    if p.causal and p.seqlen_q != p.seqlen_k:
        detail = "SDPA's causal mask is top-left aligned; not comparable when seqlen_q != seqlen_k"
        return {"name": name, "latency_ms": None, "tflops": None, "detail": detail}
    try:
        with sdpa_kernel(getattr(SDPBackend, backend)):

            def run() -> None:
                sdpa(
                    q,
                    k,
                    v,
                    is_causal=p.causal,
                    scale=1.0 / math.sqrt(p.head_dim),
                    enable_gqa=p.heads_q != p.heads_kv,
                )

            run()
            torch.cuda.synchronize()
            stats = time_kernel(run, settings).stats
        return {"name": name, "detail": "", **_row(stats, p.flops)}
    except RuntimeError as e:
        return {"name": name, "latency_ms": None, "tflops": None, "detail": str(e).splitlines()[0][:200]}


def _time_gemm(torch, dtype, gen, settings: MeasureSettings) -> dict[str, object]:
    """The 8192^3 cuBLAS GEMM's row (:data:`GEMM_PEER`); then the card idles :data:`GEMM_COOLDOWN_S` (its clocks
    come back)."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=dtype, generator=gen)
    b = torch.randn(n, n, device="cuda", dtype=dtype, generator=gen)
    stats = time_kernel(lambda: torch.matmul(a, b), settings).stats
    torch.cuda.synchronize()
    time.sleep(GEMM_COOLDOWN_S)
    return {"name": GEMM_PEER, "detail": "random inputs", **_row(stats, 2.0 * n**3)}


def _row(stats: TimingStats, flops: float) -> dict[str, object]:
    tflops = flops / (stats.median_ms * 1e-3) / 1e12 if stats.median_ms > 0 else None
    return {
        "latency_ms": stats.median_ms,
        "tflops": tflops,
        "spread": stats.spread,
        "rel_ci": stats.rel_ci,
        "reps": stats.reps,
    }
