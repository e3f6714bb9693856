"""tuner.check: sweep a space without a GPU (static check, then nvcc/ptxas on a sample)."""

from __future__ import annotations

import io
import shutil

import pytest

from tests.conftest import require_family
from tuner.check import CheckReport, CheckRow, all_configs, check_space
from tuner.devices import limits_for_arch
from tuner.problem import Problem, ProblemError
from tuner.ptxas import Resources
from tuner.space import load_space

nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


@nvcc
def test_check_sm80_with_two_samples():
    require_family("sm80")
    space = load_space("sm80")
    problem = Problem(batch=1, seqlen_q=1, heads_q=1, head_dim=128)
    device = limits_for_arch(80)
    out = io.StringIO()
    report = check_space("sm80", problem, device, samples=2, jobs=2, out=out)
    assert report.ok, out.getvalue()
    default = report.default
    assert default.config == space.defaults() and default.status == "ok"
    assert default.resources is not None and not default.resources.spills
    assert 0 < default.resources.registers <= 255
    compiled = [r for r in report.rows if r.status != "infeasible"]
    assert len(compiled) == 2 and all(r.status == "ok" for r in compiled)
    infeasible = [r for r in report.rows if r.status == "infeasible"]
    assert all(r.reason and space.check(r.config, problem, device) == r.reason for r in infeasible)
    assert len(report.rows) == len(infeasible) + 2
    text = out.getvalue()
    assert "check passed" in text and "(default)" in text and "compiling 2" in text


def test_unsupported_problem_is_refused_before_compiling():
    require_family("sm80")
    with pytest.raises(ProblemError, match="96"):
        check_space("sm80", Problem(batch=1, seqlen_q=1, heads_q=1, head_dim=96), limits_for_arch(80), samples=1)


def test_all_configs_is_the_full_grid(toy_space):
    configs = all_configs(toy_space)
    assert len(configs) == toy_space.size() == len({tuple(c.values()) for c in configs})
    assert all(toy_space.validate(c) == c for c in configs)
    assert toy_space.defaults() in configs


def _row(status="ok", *, default=False, spills=False):
    resources = None
    if status == "ok":
        resources = Resources(registers=128, spill_store_bytes=8 if spills else 0, spill_load_bytes=0, stack_bytes=0,
                              static_smem_bytes=0)
    return CheckRow({"block_m": 64}, status, "" if status == "ok" else "why", resources, is_default=default)


@pytest.mark.parametrize(
    ("rows", "ok"),
    [
        ([_row(default=True), _row()], True),
        ([_row(default=True), _row(spills=True), _row("infeasible")], True),  # spills elsewhere are reported, not fatal
        ([_row(default=True, spills=True)], False),
        ([_row(default=True), _row("compile_error")], False),
        ([_row("infeasible", default=True), _row()], False),
        ([_row("compile_error", default=True)], False),
    ],
)
def test_report_ok(toy_space, rows, ok):
    report = CheckReport(toy_space, rows)
    assert report.ok is ok
    assert len(report.spilling) == sum(r.resources is not None and r.resources.spills for r in rows)
    assert len(report.compile_errors) == sum(r.status == "compile_error" for r in rows)
