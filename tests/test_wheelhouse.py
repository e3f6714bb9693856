"""tuner.wheelhouse: the pip commands it runs (mocked: no registry here), --skip, and the marker warning."""

from __future__ import annotations

import subprocess
import sys

from tuner import wheelhouse


def test_builds_the_wheel_downloads_for_the_node_and_drops_skipped_packages(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_run(cmd, check):
        calls.append(cmd)
        dest = tmp_path / "house"
        if cmd[3] == "wheel":
            (dest / "flashtune-0.1.0-py3-none-any.whl").write_bytes(b"")
        else:
            for name in (
                "optuna-5.0.0-py3-none-any.whl",
                "cupy_cuda13x-14.2.0-cp312-cp312-manylinux2014_x86_64.whl",
                "NumPy-2.3.0-cp312-cp312-manylinux_2_28_x86_64.whl",
            ):
                (dest / name).write_bytes(b"")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(wheelhouse.subprocess, "run", fake_run)
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    kept = wheelhouse.build_wheelhouse(
        tmp_path / "house", python_version=here, skip=("cupy-cuda13x", "numpy"), extras="postgres"
    )
    assert [p.name for p in kept] == ["flashtune-0.1.0-py3-none-any.whl", "optuna-5.0.0-py3-none-any.whl"]
    wheel_cmd, download_cmd = calls
    assert wheel_cmd[3:5] == ["wheel", "--no-deps"]
    assert download_cmd[3] == "download" and f"--python-version={here}" in download_cmd
    assert "--only-binary=:all:" in download_cmd and "--platform=manylinux2014_x86_64" in download_cmd
    assert download_cmd[-1].endswith("flashtune-0.1.0-py3-none-any.whl[postgres]")


def test_a_node_with_another_python_gets_a_warning_about_markers(monkeypatch):
    other = "3.9" if sys.version_info[:2] != (3, 9) else "3.13"
    mismatches = wheelhouse.marker_mismatches(other, wheelhouse.PLATFORMS)
    assert any(f"the node's {other}" in m for m in mismatches)
    monkeypatch.setattr(wheelhouse.platform, "machine", lambda: "aarch64")
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert any("the node Linux x86_64" in m for m in wheelhouse.marker_mismatches(here, wheelhouse.PLATFORMS))
