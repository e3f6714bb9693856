"""A wheel built from the repo carries kernel_src/ and search_spaces/ and works outside the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if built.returncode:
        pytest.fail(f"pip wheel failed: {built.stderr[-1500:]}")
    wheel = next(out.glob("flashtune-*.whl"))
    target = out / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return wheel, target


def test_wheel_contains_the_kernel_sources_and_spaces(installed):
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    for path in (
        "kernel_src/sm80/flash_fwd.cu",
        "kernel_src/sm80/config.cuh",
        "kernel_src/sm90/flash_fwd.cu",
        "search_spaces/sm80.toml",
        "search_spaces/sm90.toml",
    ):
        assert f"tuner/_data/{path}" in names
    assert not [n for n in names if n.startswith(("tests/", "scratch/"))]


def test_installed_wheel_works_outside_the_checkout(installed, tmp_path):
    _, target = installed
    env = {**os.environ, "PYTHONPATH": str(target), "FLASHTUNE_CACHE_DIR": str(tmp_path / "cache")}
    code = (
        "import tuner, tuner.paths as p; from tuner.space import available_families; "
        "print(p.KERNEL_SRC); print(available_families())"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    )
    assert str(target) in shown.stdout and "['sm80', 'sm90']" in shown.stdout
    checked = subprocess.run(
        [sys.executable, "-m", "tuner", "check", "--family", "sm80", "--samples", "1", "--jobs", "1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert checked.returncode == 0, checked.stdout[-1500:] + checked.stderr[-1500:]
    assert "check passed" in checked.stdout
