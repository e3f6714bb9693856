"""tests/search/score.py: design sweeps by default, a held-out one only when asked for."""

from __future__ import annotations

import pytest

from tests.gpu.measure_sweeps import SEALED, SWEEPS
from tests.search import score


def test_without_held_out_no_held_out_sweep_is_listed():
    names = score.sweep_names(False)
    assert names and not any(score.held_out(n) for n in names)
    assert set(score.sweep_names(True)) - set(names) == {s.name for s in SWEEPS if s.held_out}


def test_asking_for_a_held_out_sweep_without_the_flag_is_refused(capsys):
    name = next(s.name for s in SWEEPS if s.held_out)
    with pytest.raises(SystemExit) as e:
        score.main(["--only", name])
    assert e.value.code == 2 and "--held-out" in capsys.readouterr().err


def test_one_design_sweep_scores_one_row(capsys):
    assert score.main(["--only", "bf16-full-n2048", "--seeds", "2", "--windows", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| bf16-full-n2048 ")]
    assert len(rows) == 1 and "| design | 1 |" in rows[0]


def test_a_sealed_sweep_is_scored_only_with_the_sealed_flag(capsys):
    if not SEALED:
        pytest.skip("no sealed sweep stored now")
    name = SEALED[0].name
    assert name not in score.sweep_names(True) and name in score.sweep_names(True, True)
    with pytest.raises(SystemExit) as e:
        score.main(["--held-out", "--only", name])
    assert e.value.code == 2 and "--sealed" in capsys.readouterr().err
    oracle = score._load(name)  # loaded from its database (not replayed here: nothing scores a sealed sweep)
    assert oracle.study_name == SEALED[0].study and oracle.best > 0 and score._split(name) == "sealed"
