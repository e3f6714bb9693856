"""tuner.ptxas: parse the resource report of ``nvcc -Xptxas=-v`` (real output from nvcc, and fixed samples)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tuner.compile import Resources, parse_ptxas

KERNELS = r"""
__device__ __noinline__ float helper(const float* x, int n) {
  float a[32];
  for (int i = 0; i < 32; ++i) a[i] = x[i * n];
  float s = 0;
  for (int i = 0; i < n; ++i) s += a[i % 32];
  return s;
}
extern "C" __global__ void with_callee(float* x, int n) { x[threadIdx.x] = helper(x, n); }
extern "C" __global__ void small_kernel(float* x) { x[threadIdx.x] *= 2.0f; }
extern "C" __global__ void with_smem(float* x) {
  __shared__ float buf[256];
  buf[threadIdx.x] = x[threadIdx.x];
  __syncthreads();
  x[threadIdx.x] = buf[255 - threadIdx.x];
}
"""

SPILLING = r"""
extern "C" __global__ void spilly(float* x, int n) {
  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = x[i * n + threadIdx.x];
#pragma unroll
  for (int r = 0; r < 8; ++r)
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = acc[i] * acc[(i + r) % 64] + 1.0f;
  float s = 0;
#pragma unroll
  for (int i = 0; i < 64; ++i) s += acc[i];
  x[threadIdx.x] = s;
}
"""


def _ptxas_log(tmp_path, source: str, *extra: str) -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    cu = tmp_path / "k.cu"
    cu.write_text(source)
    out = subprocess.run(
        [nvcc, "-cubin", "-arch=sm_80", "-Xptxas=-v", *extra, "-o", str(tmp_path / "k.cubin"), str(cu)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout + out.stderr


@pytest.fixture(scope="module")
def real_log(tmp_path_factory):
    return _ptxas_log(tmp_path_factory.mktemp("ptxas"), KERNELS)


@pytest.fixture(scope="module")
def spilling_log(tmp_path_factory):
    return _ptxas_log(tmp_path_factory.mktemp("ptxas-spill"), SPILLING, "-maxrregcount=32")


def test_real_small_kernel(real_log):
    r = parse_ptxas(real_log, "small_kernel")
    assert 1 <= r.registers <= 32
    assert (r.stack_bytes, r.spill_store_bytes, r.spill_load_bytes, r.static_smem_bytes) == (0, 0, 0, 0)
    assert not r.spills


def test_real_static_smem(real_log):
    r = parse_ptxas(real_log, "with_smem")
    assert r.static_smem_bytes == 256 * 4
    assert not r.spills


def test_real_callee_properties_are_not_taken_for_the_entry(real_log):
    """A __noinline__ callee's 'Function properties' block follows its caller's; the entry keeps its own frame."""
    assert "Function properties for _Z6helper" in real_log
    r = parse_ptxas(real_log, "with_callee")
    assert r.stack_bytes > 0  # the call needs a stack frame in the entry
    assert r.registers > 0


def test_real_spills_are_detected(spilling_log):
    r = parse_ptxas(spilling_log, "spilly")
    assert r.registers <= 32
    assert r.spill_store_bytes > 0 and r.spill_load_bytes > 0
    assert r.spills


def test_real_missing_entry_raises(real_log):
    with pytest.raises(ValueError, match="no_such_kernel"):
        parse_ptxas(real_log, "no_such_kernel")


SAMPLE = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'flashtune_fwd' for 'sm_90a'
ptxas info    : Function properties for flashtune_fwd
    16 bytes stack frame, 24 bytes spill stores, 40 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 16 bytes cumulative stack size, 2048 bytes smem, 592 bytes cmem[0]
ptxas info    : Compile time = 812.4 ms
ptxas info    : Compiling entry function 'other' for 'sm_90a'
ptxas info    : Function properties for other
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 0 barriers, 360 bytes cmem[0]
"""

OLD_FORMAT = """\
ptxas info    : Compiling entry function 'flashtune_fwd' for 'sm_80'
ptxas info    : Function properties for flashtune_fwd
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, 448 bytes cmem[0]
"""


def test_sample_with_spills():
    r = parse_ptxas(SAMPLE, "flashtune_fwd")
    assert r == Resources(
        registers=255, spill_store_bytes=24, spill_load_bytes=40, stack_bytes=16, static_smem_bytes=2048
    )
    assert r.spills
    assert r.to_dict() == {
        "registers": 255,
        "spill_store_bytes": 24,
        "spill_load_bytes": 40,
        "stack_bytes": 16,
        "static_smem_bytes": 2048,
    }


def test_sample_other_entry_is_not_mixed_up():
    r = parse_ptxas(SAMPLE, "other")
    assert r == Resources(registers=12, spill_store_bytes=0, spill_load_bytes=0, stack_bytes=0, static_smem_bytes=0)


def test_sample_without_barriers_or_smem():
    r = parse_ptxas(OLD_FORMAT, "flashtune_fwd")
    assert r.registers == 168 and r.static_smem_bytes == 0 and not r.spills


@pytest.mark.parametrize("spill", [(8, 0), (0, 8)])
def test_a_single_spill_direction_counts(spill):
    log = OLD_FORMAT.replace(
        "0 bytes spill stores, 0 bytes spill loads", f"{spill[0]} bytes spill stores, {spill[1]} bytes spill loads"
    )
    assert parse_ptxas(log, "flashtune_fwd").spills


@pytest.mark.parametrize("log", ["", "nvcc fatal: something", SAMPLE.replace("Used 255 registers", "Used many")])
def test_missing_entry_raises(log):
    with pytest.raises(ValueError, match="flashtune_fwd"):
        parse_ptxas(log, "flashtune_fwd")


def test_entry_name_must_match_exactly():
    with pytest.raises(ValueError):
        parse_ptxas(SAMPLE, "flashtune")
