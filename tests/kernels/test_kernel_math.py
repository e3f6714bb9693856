"""Kernel math that runs on the CPU as well: ft_common::exp2_poly (kernel_src/common/convert.cuh), the
polynomial 2^x the sm90 softmax uses for a share of its exponentials (knob poly_exp). Needs nvcc."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import build_host_check

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


def test_exp2_poly_is_within_fp16_rounding_and_exactly_zero_when_masked(tmp_path):
    exe = tmp_path / "exp2_poly_check"
    build_host_check(Path(__file__).parent / "exp2_poly_check.cu", exe)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    worst = float(run.stdout.split()[1])
    assert 0 < worst <= 1.1e-4  # fp16 rounds P to 2^-11 = 4.9e-4 relative: the polynomial adds little
