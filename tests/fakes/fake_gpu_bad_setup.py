"""A worker handler whose setup fails, as ``tuner.gpu.measure`` does on a machine without a GPU."""

from __future__ import annotations


def setup(device: int) -> None:
    raise RuntimeError(f"no CUDA-capable device {device} is detected")


def run_job(job):  # pragma: no cover - never reached
    raise AssertionError("setup failed, no job may run")
