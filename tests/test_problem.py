"""tuner.problem: validation, FLOP count, names, macros."""

from __future__ import annotations

import pytest

from tuner.problem import Problem, ProblemError


def _visible_pairs(seqlen_q: int, seqlen_k: int, causal: bool) -> int:
    """Brute force: query row i sees key j iff j <= i + seqlen_k - seqlen_q (bottom-right aligned)."""
    if not causal:
        return seqlen_q * seqlen_k
    return sum(1 for i in range(seqlen_q) for j in range(seqlen_k) if j <= i + seqlen_k - seqlen_q)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch": 0},
        {"batch": -1},
        {"seqlen_q": 0},
        {"seqlen_k": 0},
        {"heads_q": 0},
        {"heads_kv": 0},
        {"head_dim": 0},
        {"head_dim": -64},
        {"batch": True},
        {"batch": 2.0},
        {"seqlen_q": "128"},
    ],
)
def test_non_positive_or_non_integer_sizes_are_refused(kwargs):
    base = {"batch": 2, "seqlen_q": 128, "heads_q": 8, "head_dim": 64}
    name = next(iter(kwargs))
    with pytest.raises(ProblemError, match=name):
        Problem(**{**base, **kwargs})


@pytest.mark.parametrize(("heads_q", "heads_kv"), [(8, 3), (8, 16), (6, 4)])
def test_kv_heads_must_divide_query_heads(heads_q, heads_kv):
    with pytest.raises(ProblemError, match="heads_kv"):
        Problem(batch=1, seqlen_q=64, heads_q=heads_q, heads_kv=heads_kv, head_dim=64)


@pytest.mark.parametrize("dtype", ["fp32", "float16", "FP16", "", "int8"])
def test_unknown_dtype_is_refused(dtype):
    with pytest.raises(ProblemError, match="dtype"):
        Problem(batch=1, seqlen_q=64, heads_q=1, head_dim=64, dtype=dtype)


def test_problem_error_is_a_value_error_and_flashtune_error():
    from tuner.errors import FlashtuneError

    with pytest.raises(ValueError):
        Problem(batch=0, seqlen_q=64, heads_q=1, head_dim=64)
    assert issubclass(ProblemError, FlashtuneError)


def test_defaults_fill_seqlen_k_and_heads_kv():
    p = Problem(batch=1, seqlen_q=300, heads_q=12, head_dim=64)
    assert p.seqlen_k == 300
    assert p.heads_kv == 12
    assert p.dtype == "fp16" and p.causal is False


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_dtype_bytes(dtype):
    assert Problem(batch=1, seqlen_q=1, heads_q=1, head_dim=64, dtype=dtype).dtype_bytes == 2


@pytest.mark.parametrize(
    ("seqlen_q", "seqlen_k"),
    [(1, 1), (7, 7), (64, 64), (5, 9), (9, 5), (1, 100), (100, 1), (33, 128), (128, 33), (200, 199)],
)
@pytest.mark.parametrize("causal", [False, True])
def test_flops_match_brute_force_count(seqlen_q, seqlen_k, causal):
    p = Problem(batch=3, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_q=4, heads_kv=2, head_dim=64, causal=causal)
    expected = 4 * 3 * 4 * 64 * _visible_pairs(seqlen_q, seqlen_k, causal)
    assert p.flops == pytest.approx(expected, rel=0, abs=0)


def test_causal_square_is_about_half_of_full():
    full = Problem(batch=1, seqlen_q=4096, heads_q=1, head_dim=128).flops
    causal = Problem(batch=1, seqlen_q=4096, heads_q=1, head_dim=128, causal=True).flops
    assert causal == pytest.approx(full * (4096 + 1) / (2 * 4096))


def test_flops_ignore_kv_heads():
    a = Problem(batch=2, seqlen_q=128, heads_q=8, head_dim=64)
    b = Problem(batch=2, seqlen_q=128, heads_q=8, heads_kv=1, head_dim=64)
    assert a.flops == b.flops == 4 * 2 * 8 * 128 * 128 * 64


@pytest.mark.parametrize(
    ("kwargs", "slug"),
    [
        ({"batch": 8, "seqlen_q": 2048, "heads_q": 16, "head_dim": 128}, "fp16-d128-full-b8-h16-n2048"),
        (
            {"batch": 8, "seqlen_q": 2048, "heads_q": 16, "head_dim": 128, "causal": True, "dtype": "bf16"},
            "bf16-d128-causal-b8-h16-n2048",
        ),
        (
            {"batch": 1, "seqlen_q": 128, "seqlen_k": 4096, "heads_q": 32, "heads_kv": 8, "head_dim": 64},
            "fp16-d64-full-b1-h32-kv8-n128x4096",
        ),
        (
            {"batch": 1, "seqlen_q": 128, "seqlen_k": 128, "heads_q": 32, "heads_kv": 32, "head_dim": 64},
            "fp16-d64-full-b1-h32-n128",
        ),
    ],
)
def test_slug(kwargs, slug):
    assert Problem(**kwargs).slug() == slug


def test_slug_distinguishes_problems():
    base = {"batch": 2, "seqlen_q": 256, "heads_q": 8, "head_dim": 64}
    variants = [
        {},
        {"causal": True},
        {"dtype": "bf16"},
        {"batch": 3},
        {"seqlen_q": 512},
        {"seqlen_k": 512},
        {"heads_q": 16},
        {"heads_kv": 4},
        {"head_dim": 128},
    ]
    slugs = {Problem(**{**base, **v}).slug() for v in variants}
    assert len(slugs) == len(variants)


def test_env():
    p = Problem(batch=2, seqlen_q=100, seqlen_k=300, heads_q=8, heads_kv=2, head_dim=128, dtype="bf16", causal=True)
    assert p.env() == {
        "batch": 2,
        "seqlen_q": 100,
        "seqlen_k": 300,
        "heads_q": 8,
        "heads_kv": 2,
        "head_dim": 128,
        "dtype_bytes": 2,
        "is_bf16": 1,
        "causal": 1,
    }
    q = Problem(batch=1, seqlen_q=1, heads_q=1, head_dim=64)
    assert q.env()["is_bf16"] == 0 and q.env()["causal"] == 0
    assert all(type(v) is int for v in p.env().values())


@pytest.mark.parametrize(
    ("dtype", "causal", "bf16", "is_causal"),
    [("fp16", False, 0, 0), ("bf16", False, 1, 0), ("fp16", True, 0, 1), ("bf16", True, 1, 1)],
)
def test_macros(dtype, causal, bf16, is_causal):
    p = Problem(batch=1, seqlen_q=1, heads_q=1, head_dim=64, dtype=dtype, causal=causal)
    assert p.macros() == {"FT_HEAD_DIM": 64, "FT_IS_BF16": bf16, "FT_IS_CAUSAL": is_causal}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch": 8, "seqlen_q": 2048, "heads_q": 16, "head_dim": 128},
        {
            "batch": 1,
            "seqlen_q": 5,
            "seqlen_k": 9,
            "heads_q": 4,
            "heads_kv": 2,
            "head_dim": 64,
            "dtype": "bf16",
            "causal": True,
        },
    ],
)
def test_dict_round_trip(kwargs):
    import json

    p = Problem(**kwargs)
    d = p.to_dict()
    assert Problem.from_dict(d) == p
    assert Problem.from_dict(json.loads(json.dumps(d))) == p  # as stored in a study's user attributes
    assert d["seqlen_k"] == p.seqlen_k and d["heads_kv"] == p.heads_kv


def test_from_dict_validates():
    d = Problem(batch=1, seqlen_q=64, heads_q=4, head_dim=64).to_dict()
    with pytest.raises(ProblemError):
        Problem.from_dict({**d, "heads_kv": 3})


def test_problem_is_frozen_and_hashable():
    p = Problem(batch=1, seqlen_q=64, heads_q=4, head_dim=64)
    with pytest.raises(AttributeError):
        p.batch = 2  # type: ignore[misc]
    assert hash(p) == hash(Problem(batch=1, seqlen_q=64, seqlen_k=64, heads_q=4, heads_kv=4, head_dim=64))
