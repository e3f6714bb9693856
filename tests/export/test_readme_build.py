"""The README's nvcc lines build as written: each is taken from the README and run with nvcc on a header
that ``flashtune export`` wrote for a study of the family the line names."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fake_studies import make_study
from tuner.problem import Problem
from tuner.space import available_families

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"


def _nvcc_lines() -> list[str]:
    """Every command line of a README code block that runs nvcc, comment dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    lines = [line.split("#", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("nvcc ")]


def test_the_readme_shows_a_complete_nvcc_line_for_every_family():
    lines = _nvcc_lines()
    families = {re.search(r"kernel_src/(\w+)/", line).group(1) for line in lines}
    assert families == set(available_families()) & {"sm80", "sm90"}
    for line in lines:
        assert "..." not in line and "-arch=" in line and "-include best.h" in line


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
@pytest.mark.parametrize("line", _nvcc_lines())
def test_the_readme_nvcc_line_builds_as_written(line, tmp_path):
    family = re.search(r"kernel_src/(\w+)/", line).group(1)
    url = f"sqlite:///{tmp_path}/studies.db"
    problem = Problem(batch=4, seqlen_q=2048, heads_q=16, head_dim=128, dtype="fp16")
    make_study(url, "readme", family, problem, n_trials=8)  # an H200 study, its winner re-timed
    (tmp_path / "kernel_src").symlink_to(REPO / "kernel_src")  # the README runs from the checkout's root
    exported = subprocess.run(
        [sys.executable, "-m", "tuner", "export", "--storage", url, "--study", "readme", "-o", "best.h"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert exported.returncode == 0, exported.stderr
    built = subprocess.run(shlex.split(line), cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    out = shlex.split(line)[shlex.split(line).index("-o") + 1]
    assert (tmp_path / out).stat().st_size > 0
