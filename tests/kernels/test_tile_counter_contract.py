"""A kernel reads the dynamic scheduler's tile counter exactly where its space file passes one.

The ABI ``sm90_tma_sched`` ends in a ``tile_counter`` pointer that the host sets only where the space's
``[launch.abi] tile_counter`` is non-zero (a null pointer otherwise). A kernel built without the
``scheduler`` knob takes the macro's default, so that default must be the order that reads no counter:
every sm90 space file (the package's and the test data's, some of which declare no scheduler knob) is
built at its default config, and its PTX has a global atomic exactly when its launch passes a counter.
Needs nvcc (PTX only: no ptxas), not a GPU."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tuner.compile import nvcc_options
from tuner.devices import limits_for_arch
from tuner.problem import Problem
from tuner.space import load_space

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")

TESTS = Path(__file__).resolve().parents[1]
SPACES = [
    "sm90",
    TESTS / "data" / "sm90_small.toml",
    *sorted((TESTS / "data" / "sweep_spaces").glob("sm90_*.toml")),
    TESTS / "search" / "sm90_d64.toml",
]


def _ptx(space, config, problem, device, tmp_path) -> str:
    source = tmp_path / "entry.cu"
    source.write_text(f'#include "{space.family.source}"\n')
    out = tmp_path / "entry.ptx"
    options = nvcc_options(space.build_macros(config, problem, device), space.root)
    cmd = ["nvcc", "-ptx", f"-arch=sm_{space.arch_string(device.arch)}", *options, str(source), "-o", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return out.read_text()


def _cases():
    for spec in SPACES:
        space = load_space(spec)
        head_dim = 128 if 128 in space.family.head_dims else space.family.head_dims[0]
        yield pytest.param(spec, head_dim, {}, id=f"{space.name}-d{head_dim}")
    yield pytest.param("sm90", 128, {"scheduler": 0}, id="sm90-d128-static-order")


@pytest.mark.parametrize(("spec", "head_dim", "overrides"), list(_cases()))
def test_the_kernel_reads_a_counter_exactly_where_its_launch_passes_one(spec, head_dim, overrides, tmp_path):
    space = load_space(spec)
    device = limits_for_arch(90)
    problem = Problem(batch=4, seqlen_q=2048, heads_q=16, head_dim=head_dim, dtype="fp16")
    config = {**space.defaults(problem=problem, device=device), **overrides}
    assert space.check(config, problem, device) is None
    passes = bool(int(space.launch(config, problem, device).abi.get("tile_counter", 1)))
    reads = "atom.global" in _ptx(space, config, problem, device, tmp_path)
    assert reads == passes, (
        f"{space.name} at its defaults {config}: the kernel {'reads' if reads else 'does not read'} the tile "
        f"counter, its launch {'passes' if passes else 'does not pass'} one"
    )
