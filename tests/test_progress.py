"""tuner.progress: the one-line log format, -v/-q levels, and progress with time estimates on a terminal
(tqdm) and off one (plain lines every few seconds)."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.progress import Progress, configure_logging, log

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _restore_logger():
    yield
    for handler in list(log.handlers):
        log.removeHandler(handler)
    log.setLevel(logging.NOTSET)
    log.propagate = True


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_off_a_terminal_a_plain_line_every_few_seconds_with_the_time_left():
    out, clock = io.StringIO(), Clock()
    with Progress(10, desc="replay", unit="run", stream=out, every_s=5, clock=clock, terminal=False) as shown:
        for _ in range(4):  # 4 runs in 4 s: within the first 5 s, no line yet
            clock.now += 1
            shown.update(1)
        assert out.getvalue() == ""
        clock.now += 1
        shown.update(1, "best 12.5")  # 5 of 10 after 5 s: about 5 s left
        assert out.getvalue() == "flashtune: replay: 5/10 runs  best 12.5  00:05 elapsed, ~00:05 left\n"
        clock.now += 2
        shown.update(1)  # 2 s after the last line: none
        assert out.getvalue().count("\n") == 1
        clock.now += 8
        shown.update(3)  # 9 of 10 after 15 s
        assert out.getvalue().splitlines()[-1] == "flashtune: replay: 9/10 runs  00:15 elapsed, ~00:01 left"
        shown.update(1)
    assert out.getvalue().splitlines()[-1] == "flashtune: replay: 10/10 runs  00:15 elapsed"  # the end, always
    assert out.getvalue().count("\n") == 3


def test_on_a_terminal_a_tqdm_bar_with_rate_and_estimate():
    out = io.StringIO()
    with Progress(8, desc="check", unit="compile", stream=out, terminal=True) as shown:
        shown.update(2, "0 compile errors")
        shown.write("[1/8] ok ...")
        shown.update(6)
    text = out.getvalue()
    assert "\r" in text and "check:" in text and "8/8" in text and "compile/s" in text
    assert "<" in text  # tqdm's [elapsed<remaining]
    assert "[1/8] ok ..." in text and "0 compile errors" in text


def test_quiet_shows_no_progress_and_verbose_shows_debug_lines():
    out = io.StringIO()
    configure_logging(-1, out)
    with Progress(3, desc="tune", unit="trial", stream=out, terminal=False, every_s=0) as shown:
        shown.update(3)
    log.info("a run started")
    log.warning("a thing to know\nsecond line")
    log.debug("a trial")
    assert out.getvalue() == "flashtune: warning: a thing to know second line\n"

    out = io.StringIO()
    configure_logging(1, out)
    log.info("a run started")
    log.debug("a trial")
    log.error("broken")
    assert out.getvalue().splitlines() == [
        "flashtune: a run started",
        "flashtune: debug: a trial",
        "flashtune: error: broken",
    ]
    configure_logging(-2, out)
    log.warning("hidden")
    assert "hidden" not in out.getvalue()


def test_every_command_takes_v_and_q():
    import argparse

    from tuner.cli._parser import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(sub.choices) >= 9
    for name, command in sub.choices.items():
        flags = {flag for action in command._actions for flag in action.option_strings}
        assert {"-v", "--verbose", "-q", "--quiet"} <= flags, name


def _replay(*flags):
    data = REPO / "tests" / "data"
    return subprocess.run(
        [sys.executable, "-m", "tuner", "replay", "--storage", f"sqlite:///{data / 'h200_sm90_small_grid.db'}",
         "--study", "grid-small", "--space", str(data / "sm90_small.toml"), "--samplers", "random",
         "--seeds", "2", "--budget", "10", "--jobs", "1", *flags],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip


def test_a_command_in_a_pipe_prints_plain_progress_and_q_silences_it():
    shown = _replay()
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr.splitlines()[-1].startswith("flashtune: replay: 2/2 runs")
    assert "\r" not in shown.stderr and "\x1b" not in shown.stderr
    quiet = _replay("-q")
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout == shown.stdout
    verbose = _replay("-v")
    assert "flashtune: debug: replayed random seed 1" in verbose.stderr
    assert "flashtune: debug: trial 0: ok" in verbose.stderr
