"""The packed 16-bit exponentials on the GPU (kernels/exp2_packed_check.cu): their accuracy within the bounds
the CPU error model needs (tests/kernels/softmax_rounding_model.py: f16x2 better than the PTX ISA's bound), and their throughput
beside the fp32 MUFU.EX2 the sm90 softmax uses, printed for the decision on a packed-exponential knob."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.kernels.softmax_rounding_model import EX2_F16X2_NEEDED, EX2_MAX_REL_ERROR

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


def test_packed_ex2_accuracy_and_throughput(tmp_path, device):
    exe = tmp_path / "exp2_packed_check"
    source = Path(__file__).parent / "kernels" / "exp2_packed_check.cu"
    arch = f"sm_{device.arch}{'a' if device.arch == 90 else ''}"
    subprocess.run(["nvcc", "-std=c++17", "-O3", f"-arch={arch}", str(source), "-o", str(exe)], check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    print(run.stdout)
    lines = [line.split() for line in run.stdout.splitlines()]
    accuracy = {f[1]: float(f[3]) for f in lines if f[0] == "accuracy"}
    rate = {f[1]: float(f[2]) for f in lines if f[0] == "throughput"}
    assert accuracy["f16x2"] <= EX2_F16X2_NEEDED, accuracy  # else exp2_packed breaks the LSE of peaked rows
    assert accuracy["bf16x2"] <= EX2_MAX_REL_ERROR["bf16"], accuracy
    assert set(rate) == {"f32", "f16x2", "bf16x2"} and min(rate.values()) > 0, rate
    print(
        f"packed / fp32 exponentials per ns: f16x2 {rate['f16x2'] / rate['f32']:.3f}, "
        f"bf16x2 {rate['bf16x2'] / rate['f32']:.3f}"
    )
