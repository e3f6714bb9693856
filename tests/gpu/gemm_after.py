"""Does a cuBLAS GEMM just before a kernel's timing lower its figure? A device script, not a pytest module.

Ours (tuner.attention, the default config) and cuDNN SDPA, each timed 5 times (the median of 40 event-timed
launches, an L2 flush before each) (a) after 150 ms idle and (b) right after a 100 ms burst of an 8192^3 fp16 GEMM.
From the repo root, on the H200 (about 40 s): ``python -m tests.gpu.gemm_after``. H200, 2026-12-04: 0.74-0.77x
after the GEMM at short d64 causal shapes, 0.83-0.88x at d128 N8192 (BENCHMARKS.md, session 19), which is why
tuner.gpu idles GEMM_COOLDOWN_S after timing its GEMM peer and ``bench --suite`` times the GEMM apart from its rounds.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tuner

# (dtype, head_dim, causal, batch, heads, seqlen)
SHAPES = [
    ("fp16", 64, True, 32, 32, 512),
    ("fp16", 64, True, 16, 32, 1024),
    ("bf16", 64, True, 8, 32, 2048),
    ("fp16", 128, False, 2, 16, 8192),
]
REPEATS = 5
LAUNCHES = 40


@functools.cache
def _flush() -> torch.Tensor:
    """Twice the H200's 60 MB L2."""
    return torch.empty(2 * 60 * 2**20 // 4, dtype=torch.int32, device="cuda")


def timed_ms(fn: Callable[[], object]) -> float:
    """The median GPU time of LAUNCHES launches, each after an L2 flush, between two events."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(LAUNCHES)]
    for i, (start, end) in enumerate(events):
        _flush().fill_(i)
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def gemm_burst(a: torch.Tensor, b: torch.Tensor, ms: float = 100.0) -> None:
    t0 = time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < ms:
        for _ in range(20):
            torch.matmul(a, b)
        torch.cuda.synchronize()


def tflops_after(fn: Callable[[], object], flops: float, before: Callable[[], None]) -> float:
    times = []
    for _ in range(REPEATS):
        before()
        for _ in range(3):
            fn()
        times.append(timed_ms(fn))
    return flops / (statistics.median(times) * 1e-3) / 1e12


def idle() -> None:
    torch.cuda.synchronize()
    time.sleep(0.15)


def main() -> None:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    b = torch.randn_like(a)
    for dtype_name, head_dim, causal, batch, heads, seqlen in SHAPES:
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
        q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=dtype) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

        def ours(q=q, k=k, v=v, causal=causal) -> None:
            tuner.attention(q, k, v, causal=causal)

        def cudnn(qt=qt, kt=kt, vt=vt, causal=causal) -> None:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        flops = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
        line = f"{dtype_name} d{head_dim} {'causal ' if causal else ''}B{batch} H{heads} N{seqlen}:"
        for name, fn in (("ours", ours), ("cuDNN", cudnn)):
            fn()
            rest = tflops_after(fn, flops, idle)
            hot = tflops_after(fn, flops, lambda: gemm_burst(a, b))
            line += f" {name} idle {rest:.0f} after the GEMM {hot:.0f} ({hot / rest:.3f});"
        print(line, flush=True)


if __name__ == "__main__":
    main()
