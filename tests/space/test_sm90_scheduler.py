"""sm90's scheduler knob: the combinations the dynamic scheduler cannot run are refused by the space file with a
message that says why and what to set, and by config.cuh's static_asserts in the same words (a build by hand
checks them too). nvcc for the header half; no GPU."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import compile_config_header
from tuner.devices import limits_for_arch
from tuner.problem import Problem
from tuner.space import load_space

H200 = limits_for_arch(90)
PROBLEM = Problem(batch=1, seqlen_q=4096, heads_q=28, heads_kv=4, head_dim=128, causal=True)
CLUSTER = {"cta_mode": 2, "producer_regs": 32, "consumer_regs": 232}

# partial config -> (constraint, words of its message, words of config.cuh's static_assert)
REFUSED = {
    "one_cta_per_block": (
        {"scheduler": 1, "persistent": 0},
        "dynamic_scheduler_persistent",
        ["persistent CTAs", "set persistent=1 or scheduler=0"],
        "orders the units of persistent CTAs",
    ),
    "cluster": (
        {"scheduler": 1, **CLUSTER},
        "dynamic_scheduler_alone",
        ["needs cta_mode=1", "distributed shared memory", "set cta_mode=1 or scheduler=0"],
        "needs cta_mode=1",
    ),
}


@pytest.fixture(scope="module")
def space():
    return load_space("sm90")


def test_the_knob_is_dynamic_by_default_where_persistent_is_and_static_at_d256(space):
    """Dynamic wherever the default is persistent (d64, d128: measured 1.03-1.18x the snake); d256's default
    is one CTA per block, which takes no scheduler."""
    assert space.defaults(128)["scheduler"] == 1 and space.defaults(64)["scheduler"] == 1
    assert space.defaults(256)["scheduler"] == 0 and space.defaults(256)["persistent"] == 0
    for head_dim in (64, 128):
        problem = Problem(batch=1, seqlen_q=4096, heads_q=28, heads_kv=4, head_dim=head_dim, causal=True)
        default = space.defaults(head_dim)
        assert space.check(default, problem, H200) is None
        assert space.launch(default, problem, H200).abi["tile_counter"] == 1
        static = {**default, "scheduler": 0}
        assert space.check(static, problem, H200) is None
        assert space.launch(static, problem, H200).abi["tile_counter"] == 0
    # the cluster alone runs, with the static order
    assert space.check({**space.defaults(128), **CLUSTER, "scheduler": 0}, PROBLEM, H200) is None


@pytest.mark.parametrize("name", list(REFUSED))
def test_the_space_refuses_what_the_dynamic_scheduler_cannot_run(space, name):
    partial, constraint, words, _ = REFUSED[name]
    config = space.validate(partial, partial=True, head_dim=128)
    reasons = space.violations(config, PROBLEM, H200)
    assert [r.split(":", 1)[0] for r in reasons] == [constraint], reasons
    assert all(w in reasons[0] for w in words), reasons[0]
    assert space.check({**config, "scheduler": 0}, PROBLEM, H200) is None  # the static scheduler runs it


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name", list(REFUSED))
def test_the_config_header_refuses_them_too(space, name, tmp_path):
    partial, _, _, assertion = REFUSED[name]
    config = space.validate(partial, partial=True, head_dim=128)

    def build(cfg):
        return compile_config_header(space, space.build_macros(cfg, PROBLEM, H200), "90a", tmp_path)

    refused = build(config)
    assert refused.returncode != 0 and assertion in refused.stderr, refused.stderr[-2000:]
    assert build({**config, "scheduler": 0}).returncode == 0
