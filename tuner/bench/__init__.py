"""TODO tuner.bench."""

from ._api import ApiRow, DEFAULT_SHAPES, HOST_US_TARGET, host_us_per_call, render_table, run_api_bench
from ._bench import run_bench, study_for_bench
from ._suite import bench_suite, markdown_table

__all__ = ['ApiRow', 'DEFAULT_SHAPES', 'HOST_US_TARGET', 'bench_suite', 'host_us_per_call', 'markdown_table', 'render_table', 'run_api_bench', 'run_bench', 'study_for_bench']
