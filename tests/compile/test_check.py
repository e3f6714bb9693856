"""tuner.check: sweep a space without a GPU (static check, then nvcc/ptxas on a sample)."""

from __future__ import annotations

import io
import random
import shutil

import pytest

from tests.conftest import require_family
from tuner.compile import CheckReport, CheckRow, Resources, all_configs, check_space
from tuner.compile import _check as check
from tuner.devices import limits_for_arch
from tuner.errors import UsageError
from tuner.problem import Problem, ProblemError
from tuner.space import load_space

nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


@nvcc
@pytest.mark.slow
@pytest.mark.parametrize(
    ("arch", "dtype", "causal"), [(100, "fp16", False), (103, "bf16", True)], ids=["sm_100-fp16", "sm_103-bf16-causal"]
)
def test_check_sm80_for_blackwell_on_the_default_sample(arch, dtype, causal):
    """`flashtune check --arch 100` and `--arch 103` at head dim 128 (where the sm_90 fit spilled): the
    default sample (AUTO_SAMPLES configs, the arch's default among them) compiles without a spill."""
    require_family("sm80")
    space = load_space("sm80")
    problem = Problem(batch=1, seqlen_q=1, heads_q=1, head_dim=128, dtype=dtype, causal=causal)
    out = io.StringIO()
    report = check_space("sm80", problem, limits_for_arch(arch), jobs=2, out=out)
    assert report.ok and not report.spilling, out.getvalue()
    assert report.default.config == space.defaults(128, arch) != space.defaults(128, 90)
    assert sum(r.status == "ok" for r in report.rows) == check.AUTO_SAMPLES
    assert f"sm80 on sm_{arch} for {dtype} d128" in out.getvalue()


@nvcc
@pytest.mark.slow
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


@nvcc
@pytest.mark.slow
def test_check_of_a_space_too_large_to_enumerate_draws_random_points():
    """sm90 has tens of millions of grid points: the static check draws, the default and a sample compile. At head dim
    128, where a few percent of the grid is feasible (at 256 a few in 20,000: too few to be sure of a sample)."""
    require_family("sm90")
    space = load_space("sm90")
    assert space.size() > check.EXHAUSTIVE_LIMIT
    problem = Problem(batch=1, seqlen_q=1, heads_q=1, head_dim=128, dtype="bf16", causal=True)
    out = io.StringIO()
    report = check_space("sm90", problem, limits_for_arch(90), samples=2, jobs=2, out=out)
    assert report.ok, out.getvalue()
    assert report.default.config == space.defaults(128) and report.default.status == "ok"
    infeasible = [r for r in report.rows if r.status == "infeasible"]
    assert len(infeasible) > check.DRAWS // 2  # most of the grid does not fit
    assert len({tuple(r.config.values()) for r in report.rows}) == len(report.rows)
    assert sum(r.status == "ok" for r in report.rows) == 2
    feasible = check.DRAWS + 1 - len(infeasible)  # the default and DRAWS other distinct points were checked
    assert f"{feasible} of {check.DRAWS + 1:,} random points statically feasible" in out.getvalue()
    assert "check passed" in out.getvalue()


def test_every_feasible_config_of_a_huge_space_is_refused_with_what_to_do():
    require_family("sm90")
    with pytest.raises(UsageError, match=r"too many.*--samples N"):
        check_space("sm90", Problem(batch=1, seqlen_q=1, heads_q=1, head_dim=128), limits_for_arch(90), samples=0)
    with pytest.raises(UsageError, match=r"sm90 is built for sm_90a only .*the device is sm_80: pass --arch 90"):
        check_space("sm90", Problem(batch=1, seqlen_q=1, heads_q=1, head_dim=128), limits_for_arch(80), samples=2)
    with pytest.raises(UsageError, match="--samples must be"):
        check_space("sm90", Problem(batch=1, seqlen_q=1, heads_q=1, head_dim=128), limits_for_arch(90), samples=-1)


def test_static_candidates_enumerate_a_small_space_and_draw_from_a_large_one(toy_space, monkeypatch):
    default = toy_space.defaults()
    configs, exhaustive = check.static_candidates(toy_space, default, random.Random(0))
    assert exhaustive and configs == all_configs(toy_space)
    monkeypatch.setattr(check, "EXHAUSTIVE_LIMIT", 10)
    monkeypatch.setattr(check, "DRAWS", 20)
    configs, exhaustive = check.static_candidates(toy_space, default, random.Random(0))
    assert not exhaustive and configs[0] == default and len(configs) == 21
    assert len({tuple(c.values()) for c in configs}) == 21 and all(toy_space.validate(c) == c for c in configs)
    monkeypatch.setattr(check, "DRAWS", 1000)  # more than the 54 points there are: every one, once
    configs, _ = check.static_candidates(toy_space, default, random.Random(0))
    assert sorted(tuple(c.values()) for c in configs) == sorted(tuple(c.values()) for c in all_configs(toy_space))


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
        resources = Resources(
            registers=128, spill_store_bytes=8 if spills else 0, spill_load_bytes=0, stack_bytes=0, static_smem_bytes=0
        )
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
