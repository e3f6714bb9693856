"""tuner.heartbeat: the timing knobs read from the environment (recovery itself: test_resilience.py, test_run.py)."""

from __future__ import annotations

import pytest

from tuner.heartbeat import _seconds_from_env


@pytest.mark.parametrize(("text", "expected"), [(None, 60), ("30", 30), ("30.5", 31), ("2.0", 2)])
def test_seconds_from_the_environment_are_whole_and_positive(monkeypatch, text, expected):
    if text is None:
        monkeypatch.delenv("FLASHTUNE_GRACE_PERIOD_S", raising=False)
    else:
        monkeypatch.setenv("FLASHTUNE_GRACE_PERIOD_S", text)
    assert _seconds_from_env("FLASHTUNE_GRACE_PERIOD_S", 60) == expected


@pytest.mark.parametrize("text", ["soon", "0", "-3", ""])
def test_an_unusable_value_warns_and_keeps_the_default(monkeypatch, text):
    monkeypatch.setenv("FLASHTUNE_GRACE_PERIOD_S", text)
    with pytest.warns(UserWarning, match="FLASHTUNE_GRACE_PERIOD_S.*not a positive number of seconds; using 60"):
        assert _seconds_from_env("FLASHTUNE_GRACE_PERIOD_S", 60) == 60
