"""The dispatch tables shipped in the package (tuner/serve/data/*.json, what config="auto" serves without tuned=):
each names its GPU, was exported for today's knobs (a knob added or removed since fails here, not in a user's
call: export the table again), and every tuned config is one today's space accepts and can run its shape."""

from __future__ import annotations

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


def test_an_h200_is_served_its_table_and_a_shape_it_lacks_gets_the_default_with_the_reason():
    tuned = shipped_tuned("NVIDIA  h200")  # CUDA's name, compared without case and runs of spaces
    assert tuned.shipped and tuned.source == "flashtune's nvidia_h200.json"
    space = load_space("sm90")
    table = tuned.tables["sm90"]
    dtype, head_dim, causal, seqlen, config = table.entries[0]
    problem = Problem(batch=2, seqlen_q=seqlen, heads_q=16, head_dim=head_dim, dtype=dtype, causal=causal)
    assert tuned.lookup(space, problem, 90) == (space.validate(config), None)
    lacking = next(
        (d, h, c)
        for d in space.family.dtypes
        for h in space.family.head_dims
        for c in (False, True)
        if not table.covers(d, h, c)
    )
    problem = Problem(batch=2, seqlen_q=1024, heads_q=16, head_dim=lacking[1], dtype=lacking[0], causal=lacking[2])
    config, why = tuned.lookup(space, problem, 90, limits_for_arch(90))
    assert config == space.defaults(problem=problem, device=limits_for_arch(90)) and "no tuned sm90 config" in why
    assert shipped_tuned("NVIDIA B200").tables == {}  # no table shipped: every shape gets its family default
