"""sm90's q_stages knob: one Q stage lets a persistent CTA take tiles whose second Q stage does not fit shared
memory (FA3's 128 x 176 tile at head dim 128, the head-dim-256 default tile); q_stages=1 without persistent CTAs
is refused (a CTA per block has one stage anyway) by the space file and by config.cuh in the same words, while
the default q_stages=2 stays feasible there (head dim 256's default is persistent=0). nvcc for the header half;
no GPU."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import compile_config_header
from tuner.devices import limits_for_arch
from tuner.problem import Problem
from tuner.space import complete, load_space

H200 = limits_for_arch(90)
FA3_D128 = {"block_n": 176, "consumer_wgs": 2, "kv_stages": 2, "persistent": 1}


def _problem(head_dim: int) -> Problem:
    return Problem(batch=2, seqlen_q=4096, heads_q=16, head_dim=head_dim, causal=True)


@pytest.fixture(scope="module")
def space():
    return load_space("sm90")


def test_two_stages_by_default_and_one_cta_per_block_keeps_the_default(space):
    for head_dim in (64, 128, 256):
        defaults = space.defaults(head_dim)
        assert defaults["q_stages"] == 2
        one_per_block = complete(space, {"persistent": 0}, _problem(head_dim), H200)
        assert one_per_block.config["q_stages"] == 2 and "q_stages" not in {k for k, _, _ in one_per_block.moved}
    assert space.defaults(256)["persistent"] == 0  # so its default is q_stages=2 without persistent CTAs


def test_one_q_stage_fits_fa3s_d128_tile_persistent(space):
    problem = _problem(128)
    two = space.validate(FA3_D128, partial=True, head_dim=128)
    reasons = space.violations(two, problem, H200)
    assert [r.split(":", 1)[0] for r in reasons] == ["smem_fits", "smem_per_sm_fits"], reasons
    assert "needs 247040 B" in reasons[0] and "65536 B of Q stages" in reasons[0] and "180224 B of K/V" in reasons[0]
    assert "allows 232448 B" in reasons[0], reasons[0]
    one = {**two, "q_stages": 1}
    assert space.check(one, problem, H200) is None
    assert space.environment(one, problem, H200)["smem_bytes"] == 214272
    # head dim 256's default tile, persistent: one Q stage fits (230,656 B), two do not
    d256 = {**space.defaults(256), "persistent": 1}
    assert space.check(d256, _problem(256), H200) is not None
    assert space.check({**d256, "q_stages": 1}, _problem(256), H200) is None


def test_one_q_stage_without_persistent_ctas_is_refused(space):
    config = {**space.defaults(128), "persistent": 0, "scheduler": 0, "q_stages": 1}
    reasons = space.violations(config, _problem(128), H200)
    assert [r.split(":", 1)[0] for r in reasons] == ["q_stages_persistent"], reasons
    assert all(w in reasons[0] for w in ("persistent CTA", "one stage anyway", "set q_stages=2 or persistent=1"))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_the_config_header_refuses_it_too(space, tmp_path):
    def build(cfg):
        return compile_config_header(space, space.build_macros(cfg, _problem(128), H200), "90a", tmp_path)

    config = {**space.defaults(128), "persistent": 0, "scheduler": 0, "q_stages": 1}
    refused = build(config)
    assert refused.returncode != 0 and "set q_stages=2 or persistent=1" in refused.stderr, refused.stderr[-2000:]
    assert build({**config, "q_stages": 2}).returncode == 0
    assert build({**config, "persistent": 1}).returncode == 0
