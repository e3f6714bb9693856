"""``flashtune bench --api`` without a GPU: its table and the options it refuses (the timing runs in tests/gpu)."""

from __future__ import annotations

import pytest

from tuner.bench import ApiRow, render_table
from tuner.cli import main
from tuner.problem import Problem

N2048 = Problem(batch=8, seqlen_q=2048, heads_q=16, head_dim=128)
N512 = Problem(batch=32, seqlen_q=512, heads_q=16, head_dim=128, causal=True)


def row(problem, host_us, eager, kernel) -> ApiRow:
    return ApiRow(
        problem,
        host_us={"tuner": host_us, "op": 30.0, "sdpa": 50.0},
        eager_tflops={"tuner": eager, "op": eager * 0.9, "sdpa": 600.0},
        kernel_tflops={"tuner": kernel, "sdpa": 630.0},
    )


def test_table_shows_every_caller_and_whether_the_targets_are_met():
    text = render_table([row(N2048, 12.5, 610.0, 620.0), row(N512, 14.0, 100.0, 260.0)], header="head")
    lines = text.splitlines()
    assert lines[0] == "head"
    first = next(line for line in lines if line.startswith(N2048.slug())).split()
    assert first[1:4] == ["12.5", "30.0", "50.0"] and first[4] == "610.0" and first[7:10] == ["620.0", "-", "630.0"]
    assert first[10:] == [f"{610 / 620:.3f}", "-", f"{600 / 630:.3f}"]
    assert "host time <= 20 us: met (worst 14.0 us)" in text  # N 512 is host-bound: only N >= 2048 is held to 3%
    assert "eager/kernel >= 0.97 at N >= 2048: met (worst 0.984)" in text
    slow = render_table([row(N2048, 25.0, 500.0, 620.0)], header="head")
    assert "host time <= 20 us: NOT met (worst 25.0 us)" in slow and "NOT met (worst 0.806)" in slow


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--suite", "s.toml"], "drop --suite"),
        (["--config", "auto"], "--config auto and --tuned"),
        (["--tuned", "d.json"], "--config auto and --tuned"),
        (["--config", "block_m"], "name=value pairs"),
    ],
)
def test_cli_refuses_options_that_do_not_go_with_api(argv, message, capsys):
    assert main(["bench", "--api", *argv]) == 2
    assert message in capsys.readouterr().err


def test_tuned_without_api_is_refused(capsys):
    assert main(["bench", "--tuned", "d.json"]) == 2
    assert "--tuned goes with --api" in capsys.readouterr().err
