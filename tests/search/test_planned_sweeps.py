"""Sweeps on spaces derived from today's sm90.toml (the ``*d`` files of tests/gpu/derive_sweep_spaces.py: sweeps
15-24 and any still ``PLANNED`` in tests/gpu/measure_sweeps.py): each sweep's default must be the config the tuner
ships for its problem, or the sweep would judge a search from a start no user has.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.gpu import measure_sweeps
from tests.gpu.derive_sweep_spaces import OUT
from tests.gpu.measure_sweeps import PLANNED, SEALED, SWEEPS, card_tag, feasible_count, on_card
from tuner.devices import limits_for_arch
from tuner.space import load_space

H200 = limits_for_arch(90)
DATA = OUT.parent


@pytest.mark.parametrize("sweep", [s for s in SWEEPS + SEALED + PLANNED if s.space[-1] in "de"], ids=lambda s: s.name)
def test_a_derived_sweeps_default_is_feasible_and_its_space_reduced(sweep):
    """A stored sweep keeps the default of the space it was measured with (its replays start there), whatever
    sm90.toml's rules say since; a planned one starts where a study of the shipped space would."""
    problem = sweep.problem()
    space = load_space(sweep.space_file)
    default = space.defaults(problem=problem, device=H200)
    assert space.check(default, problem, H200) is None
    if sweep in PLANNED:
        shipped = load_space("sm90").defaults(problem=problem, device=H200)
        assert {k: v for k, v in shipped.items() if k in default} == default
    assert 300 <= feasible_count(sweep) <= 1500  # issue 17: reduced spaces of 500-1,500 (d256's admit fewer)


def test_planned_sweeps_are_held_out_new_and_not_stored_yet():
    stored = {s.name for s in SWEEPS}
    assert all(s.held_out and s.name not in stored for s in PLANNED)
    stored_dbs = [on_card(s, card).db for s in PLANNED for card in ("h100", "h200")]
    assert not [db for db in stored_dbs if (DATA / db).exists()], "a measured planned sweep belongs in SWEEPS"


def test_sealed_sweeps_are_held_out_stored_and_replayed_by_no_test():
    """A sealed sweep is measured and waits, unscored, to judge the next change to the search."""
    stored = {s.name for s in SWEEPS}
    assert all(s.held_out and s.name not in stored and (DATA / s.db).exists() for s in SEALED)
    from tests.search import test_search_quality

    assert not {s.name for s in SEALED} & set(test_search_quality.SWEEPS)


def test_a_planned_sweep_takes_the_name_of_the_card_it_runs_on_and_a_stored_one_keeps_its_own(monkeypatch):
    assert card_tag("NVIDIA H100 80GB HBM3") == "h100" and card_tag("NVIDIA H200") == "h200"
    assert card_tag("NVIDIA A100-SXM4-80GB") is None
    planned = replace(SWEEPS[-1], name="d64-fp16-full-b1-h1-n128", held_out=True, gpu="h200")
    monkeypatch.setattr(measure_sweeps, "PLANNED", (planned,))
    assert planned.gpu == "h200" and on_card(planned, "h100").db.startswith("h100_sweep_")
    assert on_card(planned, None) == planned
    stored = next(s for s in SWEEPS if s.gpu == "h100")
    assert on_card(stored, "h100") == stored
    with pytest.raises(SystemExit, match="resume it on an H100"):
        on_card(stored, "h200")
