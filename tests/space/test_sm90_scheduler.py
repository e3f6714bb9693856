"""sm90's scheduler knob: dynamic by default where the default is persistent; where the dynamic scheduler cannot
run (one CTA per block, a 2-CTA cluster) scheduler=1 builds the static kernel, so a partial config such as
``persistent=0`` needs no ``scheduler=0`` beside it, and such a kernel gets no tile counter. nvcc for the header
half; no GPU."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tuner.devices import limits_for_arch
from tuner.paths import KERNEL_SRC
from tuner.problem import Problem
from tuner.space import load_space

H200 = limits_for_arch(90)
PROBLEM = Problem(batch=1, seqlen_q=4096, heads_q=28, heads_kv=4, head_dim=128, causal=True)
CLUSTER = {"cta_mode": 2, "producer_regs": 32, "consumer_regs": 232}
#: partial configs where scheduler=1 has no dynamic order to give
STATIC_ANYWAY = {"one_cta_per_block": {"scheduler": 1, "persistent": 0}, "cluster": {"scheduler": 1, **CLUSTER}}


@pytest.fixture(scope="module")
def space():
    return load_space("sm90")


def test_the_knob_is_dynamic_by_default_where_persistent_is_and_static_at_d256(space):
    """Dynamic wherever the default is persistent (d64, d128: measured 1.01-1.18x the snake); d256's default
    is one CTA per block."""
    assert space.defaults(128)["scheduler"] == 1 and space.defaults(64)["scheduler"] == 1
    assert space.defaults(256)["scheduler"] == 0 and space.defaults(256)["persistent"] == 0
    for head_dim in (64, 128):
        problem = Problem(batch=1, seqlen_q=4096, heads_q=28, heads_kv=4, head_dim=head_dim, causal=True)
        default = space.defaults(head_dim)
        assert space.check(default, problem, H200) is None
        assert space.launch(default, problem, H200).abi["tile_counter"] == 1
        static = {**default, "scheduler": 0}
        assert space.check(static, problem, H200) is None
        assert space.launch(static, problem, H200).abi["tile_counter"] == 0


@pytest.mark.parametrize("name", list(STATIC_ANYWAY))
def test_where_dynamic_cannot_run_the_config_is_feasible_and_gets_no_counter(space, name):
    config = space.validate(STATIC_ANYWAY[name], partial=True, head_dim=128)
    assert space.check(config, PROBLEM, H200) is None
    assert space.launch(config, PROBLEM, H200).abi["tile_counter"] == 0


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name", list(STATIC_ANYWAY))
def test_the_config_header_builds_them_as_the_static_kernel(space, name, tmp_path):
    """config.cuh: kDynamicScheduler is false there (a static_assert says so), and the header builds."""
    config = space.validate(STATIC_ANYWAY[name], partial=True, head_dim=128)
    unit = tmp_path / "config_only.cu"
    unit.write_text(f'#include "{space.family.config_header}"\nstatic_assert(!ft_sm90::kDynamicScheduler, "static");\n')
    macros = space.build_macros(config, PROBLEM, H200)
    built = subprocess.run(
        ["nvcc", "-std=c++17", "-I", str(KERNEL_SRC), "-arch=sm_90a", "-c", "-o", str(tmp_path / "c.o")]
        + [f"-D{k}={v}" for k, v in macros.items()]
        + [str(unit)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-2000:]
