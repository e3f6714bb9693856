"""The dispatch tables shipped in the package (tuner/serve/data/*.json, what config="auto" serves without tuned=):
each names its GPU, was exported for today's knobs (a knob added or removed since fails here, not in a user's
call: export the table again), and every tuned config is one today's space accepts and can run its shape."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tuner.devices import limits_for_arch
from tuner.problem import Problem
from tuner.serve._tuned import SHIPPED_DIR, load_tuned, shipped_tuned
from tuner.space import load_space

TABLES = sorted(Path(SHIPPED_DIR).glob("*.json"))
#: the GPUs the tables are for: their arch, so the static check runs on the device's nominal limits
ARCHS = {"NVIDIA H200": 90, "NVIDIA H100": 90}


@pytest.mark.parametrize("path", TABLES, ids=[p.name for p in TABLES])
def test_a_shipped_table_fits_todays_space_files(path):
    tuned = load_tuned(path)
    assert tuned.gpu in ARCHS, f"{path.name}: GPU {tuned.gpu!r}; add its arch to ARCHS"
    device = limits_for_arch(ARCHS[tuned.gpu])
    assert tuned.tables, f"{path.name} holds no family"
    for family, table in tuned.tables.items():
        space = load_space(family)
        assert table.knobs == tuple(k.name for k in space.knobs), f"{path.name}: export the dispatch table again"
        assert table.entries, f"{path.name}: {family} has no tuned entry"
        for dtype, head_dim, causal, seqlen, config in table.entries:
            problem = Problem(batch=1, seqlen_q=seqlen, heads_q=16, head_dim=head_dim, dtype=dtype, causal=causal)
            checked = space.validate(config)
            assert space.check(checked, problem, device) is None, (path.name, dtype, head_dim, causal, seqlen)


@pytest.mark.parametrize("path", TABLES, ids=[p.name for p in TABLES])
def test_no_shipped_winner_was_timed_against_a_default_that_has_moved_since(path):
    """A winner beat the default of its day; where a rule or default has moved since, its lead over today's
    default is unmeasured (today's default may beat it): time it again, or export the table again."""
    import json

    from tuner.export import moved_defaults

    document = json.loads(path.read_text())
    assert moved_defaults(document, limits_for_arch(ARCHS[document["gpu"]])) == []


def test_an_h200_is_served_its_table_which_covers_every_bucket_and_a_bucket_lacking_gets_the_default():
    tuned = shipped_tuned("NVIDIA  h200")  # CUDA's name, compared without case and runs of spaces
    assert tuned.shipped and tuned.source == "flashtune's nvidia_h200.json"
    space = load_space("sm90")
    table = tuned.tables["sm90"]
    dtype, head_dim, causal, seqlen, config = table.entries[0]
    problem = Problem(batch=2, seqlen_q=seqlen, heads_q=16, head_dim=head_dim, dtype=dtype, causal=causal)
    assert tuned.lookup(space, problem, 90) == (space.validate(config), None)
    buckets = [(d, h, c) for d in space.family.dtypes for h in space.family.head_dims for c in (False, True)]
    assert all(table.covers(*b) for b in buckets), "the H200 table covers every dtype, head dim and mask of sm90"
    lacking = buckets[0]  # a table without that bucket's entries: the default serves it, and says why
    partial = dataclasses.replace(table, entries=tuple(e for e in table.entries if e[:3] != lacking))
    tuned = dataclasses.replace(tuned, tables={"sm90": partial})
    problem = Problem(batch=2, seqlen_q=1024, heads_q=16, head_dim=lacking[1], dtype=lacking[0], causal=lacking[2])
    config, why = tuned.lookup(space, problem, 90, limits_for_arch(90))
    assert config == space.defaults(problem=problem, device=limits_for_arch(90)) and "no tuned sm90 config" in why
    assert shipped_tuned("NVIDIA B200").tables == {}  # no table shipped: every shape gets its family default


# -- a bucket's entry serves the call's batch and heads (the table's buckets see only dtype, head dim, mask, length)
H200 = limits_for_arch(90)


def _table_of(space, entries):
    from tuner.export import DispatchTable
    from tuner.serve import TunedConfigs

    table = DispatchTable(
        family=space.name,
        knobs=tuple(k.name for k in space.knobs),
        default=space.defaults(),
        head_dim_defaults=tuple(
            (d, space.defaults(d)) for d in space.family.head_dims if space.defaults(d) != space.defaults()
        ),
        entries=tuple(entries),
    )
    return TunedConfigs(tables={space.name: table}, source="test.json")


@pytest.mark.parametrize(
    "problem",
    [
        Problem(batch=1, seqlen_q=2048, heads_q=4, head_dim=64),  # few units: split-KV
        Problem(batch=2, seqlen_q=4096, heads_q=10, head_dim=64),  # a last wave under half full: the tail split
        Problem(batch=64, seqlen_q=256, heads_q=16, head_dim=64),  # d64, many short units: 2 warpgroups
    ],
    ids=lambda p: p.slug(),
)
def test_a_kept_default_gives_way_to_the_calls_own_default_with_its_rules(problem):
    space = load_space("sm90")
    plain = space.defaults(problem.head_dim, 90)
    own = space.defaults(problem=problem, device=H200)
    assert own != plain, "the problem must be one a [[defaults]] rule changes"
    tuned = _table_of(space, [(problem.dtype, problem.head_dim, bool(problem.causal), 8192, plain)])
    assert tuned.lookup(space, problem, 90, H200) == (own, None)
    assert tuned.lookup(space, problem, 90) == (plain, None)  # without the device: what the header's select() gives


def test_a_tuned_winner_serves_where_it_runs_and_gives_way_where_it_cannot():
    space = load_space("sm90")
    few = Problem(batch=1, seqlen_q=2048, heads_q=4, head_dim=128)
    winner = {**space.defaults(problem=few, device=H200), "rescale_slack": 4}
    assert winner["kv_splits"] > 1 and space.check(winner, few, H200) is None
    tuned = _table_of(space, [("fp16", 128, False, 2048, winner)])
    assert tuned.lookup(space, few, 90, H200) == (winner, None)
    many = Problem(batch=16, seqlen_q=2048, heads_q=32, head_dim=128)
    config, why = tuned.lookup(space, many, 90, H200)
    assert config == space.defaults(problem=many, device=H200) and config["kv_splits"] == 1
    assert "cannot run batch 16 x 32 heads" in why and "kv_splits" in why


def test_a_kept_default_that_a_rule_made_gives_way_where_the_table_says_it_was_kept():
    """A study at a shape with few units keeps its default, which carries split-KV; where the table marks it
    kept_default, a call of the bucket with many units gets its own default without a warning. Marked a winner
    (or a JSON of format 1, where only the plain default counts as kept), the same config cannot run there,
    and the call's default serves with the reason."""
    import dataclasses

    space = load_space("sm90")
    few = Problem(batch=1, seqlen_q=2048, heads_q=4, head_dim=128)
    ruled = space.defaults(problem=few, device=H200)
    assert ruled["kv_splits"] > 1 and ruled != space.defaults(128, 90)
    kept = _table_of(space, [("fp16", 128, False, 2048, ruled)])
    kept = dataclasses.replace(
        kept,
        tables={
            "sm90": dataclasses.replace(kept.tables["sm90"], kept_defaults=frozenset({("fp16", 128, False, 2048)}))
        },
    )
    many = Problem(batch=16, seqlen_q=2048, heads_q=32, head_dim=128)
    own = space.defaults(problem=many, device=H200)
    assert own["kv_splits"] == 1
    assert kept.lookup(space, many, 90, H200) == (own, None)
    assert kept.lookup(space, few, 90, H200) == (ruled, None)
    for won in (frozenset(), None):  # a winner, or a table that does not say
        table = _table_of(space, [("fp16", 128, False, 2048, ruled)])
        table = dataclasses.replace(
            table, tables={"sm90": dataclasses.replace(table.tables["sm90"], kept_defaults=won)}
        )
        config, why = table.lookup(space, many, 90, H200)
        assert config == own and "cannot run batch 16 x 32 heads" in why
