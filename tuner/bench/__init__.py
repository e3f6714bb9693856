"""``flashtune bench``: flashtune kernels timed against PyTorch's, on a GPU.

- :func:`run_bench`: one config (given, or a study's winner: :func:`study_for_bench`) against
  PyTorch SDPA's backends and a cuBLAS GEMM, timed by one GPU worker in one run.
- :func:`bench_suite` / :func:`markdown_table`: every study of a suite against the same peers,
  as the table BENCHMARKS.md records (with ``ablate``, what each tuned knob is worth).
- :func:`run_api_bench`: in this process, the host time per call of ``tuner.attention``, its
  PyTorch operator and SDPA, and eager against kernel-only TFLOPS (needs PyTorch).
"""

from ._api import (
    DEFAULT_SHAPES,
    EAGER_RATIO_TARGET,
    HOST_US_TARGET,
    ApiRow,
    host_us_per_call,
    render_table,
    run_api_bench,
)
from ._bench import run_bench, study_for_bench
from ._suite import ROUNDS, BenchRow, bench_suite, markdown_table

__all__ = [
    "DEFAULT_SHAPES",
    "EAGER_RATIO_TARGET",
    "HOST_US_TARGET",
    "ROUNDS",
    "ApiRow",
    "BenchRow",
    "bench_suite",
    "host_us_per_call",
    "markdown_table",
    "render_table",
    "run_api_bench",
    "run_bench",
    "study_for_bench",
]
