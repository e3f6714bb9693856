"""``--family auto``, the default of tune and bench: the rule's family for the GPU the command runs on."""

from __future__ import annotations

import contextlib

import pytest

import tuner.cli._commands
import tuner.run
from tests.fake_studies import A100_INFO, H200_INFO
from tuner.cli import main
from tuner.cli._args import problem_from
from tuner.cli._parser import build_parser
from tuner.problem import Problem
from tuner.space import choose_family


@pytest.mark.parametrize("command", ["tune", "bench"])
def test_auto_is_the_default_family_of_tune_and_bench(command):
    assert build_parser().parse_args([command]).family == "auto"


def test_check_needs_no_gpu_and_keeps_the_portable_family_by_default():
    assert build_parser().parse_args(["check"]).family == "sm80"


def _tuned_family(monkeypatch, capsys, tmp_path, info, *flags) -> str:
    seen = {}

    @contextlib.contextmanager
    def open_gpus(gpus):
        yield [None for _ in gpus], [info for _ in gpus]

    def run_on_gpus(spec, gpus, infos, **kw):
        seen["family"] = spec.spec.family

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tuner.run, "open_gpus", open_gpus)
    monkeypatch.setattr(tuner.run, "run_on_gpus", run_on_gpus)
    monkeypatch.setattr(tuner.cli._commands, "_retime_and_print", lambda spec, worker, args: 0)
    rc = main(["tune", "--trials", "1", "--storage", f"sqlite:///{tmp_path}/s.db", *flags])
    assert rc == 0, capsys.readouterr().err
    return seen["family"]


@pytest.mark.parametrize(
    ("info", "flags"),
    [
        (H200_INFO, ()),
        (A100_INFO, ()),
        (H200_INFO, ("--head-dim", "64", "--dtype", "bf16")),
        (A100_INFO, ("--head-dim", "64", "--causal")),
    ],
    ids=["h200", "a100", "h200-d64-bf16", "a100-d64-causal"],
)
def test_tune_with_no_family_tunes_the_family_the_rule_picks_for_the_gpu(monkeypatch, capsys, tmp_path, info, flags):
    args = build_parser().parse_args(["tune", *flags])
    expected = choose_family(int(info["arch"]), problem_from(args)).name
    assert _tuned_family(monkeypatch, capsys, tmp_path, info, *flags) == expected


def test_on_an_h200_the_default_tune_is_the_hopper_family(monkeypatch, capsys, tmp_path):
    assert _tuned_family(monkeypatch, capsys, tmp_path, H200_INFO) == "sm90"
    assert _tuned_family(monkeypatch, capsys, tmp_path, A100_INFO) == "sm80"


def test_an_explicit_family_is_kept_whatever_the_gpu(monkeypatch, capsys, tmp_path):
    assert _tuned_family(monkeypatch, capsys, tmp_path, H200_INFO, "--family", "sm80") == "sm80"


def test_check_with_auto_and_an_arch_picks_by_that_arch(capsys):
    from tuner.cli._args import resolve_family

    args = build_parser().parse_args(["check", "--family", "auto", "--arch", "90"])
    problem = Problem(batch=1, seqlen_q=1, heads_q=1, head_dim=args.head_dim, dtype=args.dtype)
    assert resolve_family(args, [problem]) == "sm90"
    args = build_parser().parse_args(["check", "--family", "auto", "--arch", "80"])
    assert resolve_family(args, [problem]) == "sm80"
