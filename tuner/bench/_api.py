"""``flashtune bench --api``: what calling a flashtune kernel from PyTorch costs, against SDPA, in this process.

For each shape it prints the host time per call of ``tuner.attention``, of
``torch.ops.flashtune.attention`` and of ``F.scaled_dot_product_attention`` (PyTorch's own
backend choice), each on a cached shape with the GPU queue far from full; the eager TFLOPS of
back-to-back calls (CUDA events: what a model sees, host gaps included); and the TFLOPS of the
kernels alone (their device time from the PyTorch profiler, i.e. CUPTI; where the profiler
records no kernel, the replay of a CUDA graph of the calls). Needs PyTorch and a GPU.

The targets of issue 9: at most 20 us of host time per ``tuner.attention`` call, and eager
TFLOPS within 3% of the kernel's at N >= 2048.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from ..errors import UsageError
from ..problem import Problem

__all__ = [
    "DEFAULT_SHAPES",
    "EAGER_RATIO_TARGET",
    "HOST_US_TARGET",
    "ApiRow",
    "eager_ms_per_call",
    "host_us_per_call",
    "kernel_ms_per_call",
    "run_api_bench",
]

DEFAULT_SHAPES = (
    Problem(batch=8, seqlen_q=2048, heads_q=16, head_dim=128, dtype="fp16"),
    Problem(batch=32, seqlen_q=512, heads_q=16, head_dim=128, dtype="fp16", causal=True),
    Problem(batch=4, seqlen_q=4096, heads_q=16, head_dim=128, dtype="bf16", causal=True),
    Problem(batch=2, seqlen_q=8192, heads_q=16, head_dim=128, dtype="fp16"),
)
HOST_US_TARGET = 20.0
EAGER_RATIO_TARGET = 0.97  # eager TFLOPS / kernel TFLOPS at seqlen >= 2048
CALLERS = ("tuner", "op", "sdpa")


@dataclass
class ApiRow:
    problem: Problem
    host_us: dict[str, float] = field(default_factory=dict)
    eager_tflops: dict[str, float] = field(default_factory=dict)
    kernel_tflops: dict[str, float] = field(default_factory=dict)
    kernel_source: str = "profiler"

    def ratio(self, caller: str) -> float | None:
        eager, kernel = self.eager_tflops.get(caller), self.kernel_tflops.get(caller)
        return eager / kernel if eager and kernel else None


def _torch():
    try:
        import torch
    except ImportError:
        raise UsageError("bench --api needs PyTorch (pip install torch)") from None
    if not torch.cuda.is_available():
        raise UsageError("bench --api needs a CUDA GPU that PyTorch can use")
    return torch


def host_us_per_call(call: Callable[[], Any], *, calls: int = 50, rounds: int = 9) -> float:
    """Median over ``rounds`` of the mean host time (us) of ``calls`` back-to-back calls, each round starting
    with an idle GPU (so no launch waits for a full queue)."""
    torch = _torch()
    per_round = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter_ns()
        for _ in range(calls):
            call()
        per_round.append((time.perf_counter_ns() - start) / calls / 1e3)
    torch.cuda.synchronize()
    return statistics.median(per_round)


def eager_ms_per_call(call: Callable[[], Any], *, target_ms: float = 200.0, rounds: int = 3) -> float:
    """Device time (ms) per call of back-to-back calls, between CUDA events on the current stream."""
    torch = _torch()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def run(n: int) -> float:
        torch.cuda.synchronize()
        start.record()
        for _ in range(n):
            call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / n

    first = run(3)
    n = int(min(2000, max(10, target_ms / max(first, 1e-3))))
    return statistics.median(run(n) for _ in range(rounds))


def kernel_ms_per_call(call: Callable[[], Any], *, calls: int = 20) -> tuple[float, str]:
    """Device time (ms) of the kernels one call launches, and how it was measured ("profiler" or "graph")."""
    torch = _torch()
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    device_us = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == DeviceType.CUDA)
    if device_us > 0:
        return device_us / calls / 1e3, "profiler"
    graph = torch.cuda.CUDAGraph()  # no kernel recorded (no CUPTI): a graph's replay has no host gaps
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        for _ in range(calls):
            call()
    return eager_ms_per_call(graph.replay, target_ms=100.0) / calls, "graph"


def _callers(torch, problem: Problem, *, family: str, config, tuned) -> dict[str, Callable[[], Any]]:
    import torch.nn.functional as F

    from ..serve import attention, register_torch_op

    register_torch_op()  # torch.ops.flashtune.attention

    p = problem
    dtype = getattr(torch, p.dtype_spec.torch_name)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(p.batch, p.seqlen_q, p.heads_q, p.head_dim, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(p.batch, p.seqlen_k, p.heads_kv, p.head_dim, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(p.batch, p.seqlen_k, p.heads_kv, p.head_dim, device="cuda", dtype=dtype, generator=gen)
    op_config = config if config is None or isinstance(config, str) else None
    gqa = {"enable_gqa": True} if p.heads_kv != p.heads_q else {}
    callers = {
        "tuner": lambda: attention(q, k, v, causal=p.causal, family=family, config=config, tuned=tuned),
        "op": lambda: torch.ops.flashtune.attention(q, k, v, p.causal, None, family, op_config, tuned),
        "sdpa": lambda: F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=p.causal, **gqa
        ),
    }
    if not isinstance(config, (str, type(None))) or not isinstance(tuned, (str, type(None))):
        del callers["op"]  # the operator takes strings only
    if p.causal and p.seqlen_q != p.seqlen_k:
        del callers["sdpa"]  # SDPA's causal mask is top-left aligned: another computation
    return callers


def bench_problem(problem: Problem, *, family: str, config=None, tuned=None) -> ApiRow:
    torch = _torch()
    row = ApiRow(problem)
    with torch.inference_mode():
        for name, call in _callers(torch, problem, family=family, config=config, tuned=tuned).items():
            call()  # builds the plan (compiles on a first run)
            torch.cuda.synchronize()
            row.host_us[name] = host_us_per_call(call)
            row.eager_tflops[name] = problem.flops / (eager_ms_per_call(call) * 1e-3) / 1e12
            kernel_ms, row.kernel_source = kernel_ms_per_call(call)
            row.kernel_tflops[name] = problem.flops / (kernel_ms * 1e-3) / 1e12
    return row


def _cell(value: float | None, spec: str) -> str:
    return format(value, spec) if value is not None else "-"


def render_table(rows: Sequence[ApiRow], *, header: str) -> str:
    lines = [
        header,
        f"{'':<34}{'host us per call':^24}{'eager TFLOPS':^24}{'kernel TFLOPS':^24}{'eager/kernel':^24}",
        f"{'shape':<34}" + "".join(f"{c:>8}" for c in CALLERS) * 4,
    ]
    for row in rows:
        lines.append(
            f"{row.problem.slug():<34}"
            + "".join(_cell(row.host_us.get(c), ".1f").rjust(8) for c in CALLERS)
            + "".join(_cell(row.eager_tflops.get(c), ".1f").rjust(8) for c in CALLERS)
            + "".join(_cell(row.kernel_tflops.get(c), ".1f").rjust(8) for c in CALLERS)
            + "".join(_cell(row.ratio(c), ".3f").rjust(8) for c in CALLERS)
        )
    host = [r.host_us["tuner"] for r in rows if "tuner" in r.host_us]
    ratios = [r.ratio("tuner") for r in rows if r.problem.seqlen_q >= 2048 and r.ratio("tuner")]
    worst_host = max(host, default=None)
    lines.append(
        f"targets: tuner.attention host time <= {HOST_US_TARGET:g} us: "
        f"{'met' if host and worst_host <= HOST_US_TARGET else 'NOT met'} "
        f"(worst {_cell(worst_host, '.1f')} us); "
        f"eager/kernel >= {EAGER_RATIO_TARGET:g} at N >= 2048: "
        f"{'met' if ratios and min(ratios) >= EAGER_RATIO_TARGET else 'NOT met'} "
        f"(worst {_cell(min(ratios, default=None), '.3f')})"
    )
    sources = sorted({r.kernel_source for r in rows})
    lines.append(f"kernel time: {' and '.join(sources)} (profiler: CUPTI kernel durations; graph: CUDA graph replay)")
    return "\n".join(lines) + "\n"


def run_api_bench(
    problems: Sequence[Problem], *, family: str, config=None, tuned=None, device: int = 0, out: TextIO
) -> list[ApiRow]:
    """Benchmark each problem on CUDA device ``device`` and print the table on ``out``."""
    torch = _torch()
    if not 0 <= device < torch.cuda.device_count():
        raise UsageError(f"--gpu {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    torch.cuda.set_device(device)
    rows = []
    for problem in problems:
        rows.append(bench_problem(problem, family=family, config=config, tuned=tuned))
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    what = "defaults" if config is None else (f"config {config}" if isinstance(config, str) else "config given")
    header = (
        f"flashtune bench --api: family {family} ({what}) on {props.name}, torch {torch.__version__}; "
        "tuner = tuner.attention, op = torch.ops.flashtune.attention, sdpa = F.scaled_dot_product_attention"
    )
    out.write(render_table(rows, header=header))
    return rows
