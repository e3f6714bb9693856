"""SIGTERM (docker stop, Slurm, timeout) and SIGHUP stop a run as Ctrl-C does: the trials in flight are
failed and enqueued again at once (not left RUNNING until a grace period ends), the exit status says
which signal, and no process the run started outlives it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

import tuner.study as st
from tests.conftest import REPO_ROOT


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found |= {int(c) for c in (task / "children").read_text().split()}
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.mark.parametrize("to", ["the tuner", "its process group"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_fails_and_requeues_the_trials_in_flight(tmp_path, signum, to):
    url = f"sqlite:///{tmp_path}/s.db"
    gate = tmp_path / "gate"
    gate.touch()  # the first measurement waits inside while the gate exists
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.standin_command", url, "stopped", "20", str(tmp_path / "log"), "0"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "FLASHTUNE_STANDIN_GATE": str(gate)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert _wait_for(lambda: Path(f"{gate}.waiting").exists() or proc.poll() is not None, 120), "never measured"
        assert proc.poll() is None, proc.communicate()
        started = _children(proc.pid)
        if to == "the tuner":
            os.kill(proc.pid, signum)
        else:
            os.killpg(proc.pid, signum)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signum, err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("[I ")]
    assert lines[-1] == f"flashtune tune: stopped by {signal.Signals(signum).name}; finished trials are stored", err
    assert "Traceback" not in err and "leaked" not in err, err
    assert _wait_for(lambda: not any(_alive(pid) for pid in started), 15), "a child outlived the run"

    study = optuna.load_study(study_name="stopped", storage=st.open_storage(url, create=False))
    trials = study.get_trials()
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert failed and all(t.user_attrs.get(st.STATUS) == "interrupted" for t in failed)
    requeued = {t.user_attrs.get(st.REQUEUED_FROM) for t in trials if t.state == TrialState.WAITING}
    assert {t.number for t in failed} <= requeued
