"""The CPU side of the GPU worker (tuner.gpu): which rows are checked, the check itself on NumPy arrays,
the reference's layout, the per-process input cache and the rule that stops timing (the GPU runs
them in tests/gpu/)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from tuner.gpu import TOLERANCES, MeasureResult, MeasureSettings
from tuner.gpu._inputs import _FULL_CHECK_ELEMENTS, _MAX_ROW_STRIDE, InputCache, ProblemData, check_rows, softmax_scale
from tuner.gpu._measure import check_output
from tuner.gpu._reference import reference_problem
from tuner.gpu._stopping import MAX_WARMUP_LAUNCHES, median_ci_rank, next_batch, timing_stats, warmup_launches
from tuner.gpu._tensors import from_float32, to_float32
from tuner.problem import DTYPES, Problem

# -- which rows are checked ------------------------------------------------------------------------


def test_a_small_problem_is_checked_on_every_row():
    assert check_rows(4, 8, 1000, 1000, np.random.default_rng(0)) is None


@pytest.mark.parametrize(
    ("batch", "heads", "seqlen_q", "seqlen_k"),
    [
        (8, 16, 2048, 2048),  # the default study: 2^29 score elements
        (1, 16, 16384, 16384),  # the sweep's longest shape
        (1, 32, 16384, 16384),
        (1, 16, 65536, 65536),  # beyond any budget: the stride stops at one row per 64-row block
        (3, 5, 4097, 9000),
    ],
)
def test_a_large_problem_is_checked_on_strided_rows_of_every_block(batch, heads, seqlen_q, seqlen_k):
    for seed in range(5):
        rows = check_rows(batch, heads, seqlen_q, seqlen_k, np.random.default_rng(seed))
        assert rows is not None and np.all(np.diff(rows) > 0) and rows[0] >= 0 and rows[-1] == seqlen_q - 1
        blocks = set((rows // _MAX_ROW_STRIDE).tolist())
        assert blocks == set(range(-(-seqlen_q // _MAX_ROW_STRIDE)))  # every 64-row block has a checked row
        stride = rows[1] - rows[0]
        if stride < _MAX_ROW_STRIDE:  # within the budget, and no finer stride would be
            assert batch * heads * (len(rows) - 1) * seqlen_k <= _FULL_CHECK_ELEMENTS
            assert batch * heads * -(-seqlen_q // (stride // 2)) * seqlen_k > _FULL_CHECK_ELEMENTS


# -- the reference and the check, on NumPy arrays ---------------------------------------------------


def naive_attention(q, k, v, scale, causal):
    """fp64 O and LSE of one head: q [Nq, D], k and v [Nk, D]; bottom-right aligned causal mask."""
    nq, nk = q.shape[0], k.shape[0]
    s = (q.astype(np.float64) @ k.astype(np.float64).T) * scale
    if causal:
        s = np.where(np.arange(nk)[None, :] <= np.arange(nq)[:, None] + nk - nq, s, -np.inf)
    m = s.max(axis=1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    l = p.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        o = np.where(l > 0, (p @ v.astype(np.float64)) / np.where(l > 0, l, 1), 0.0)
        lse = np.where(l[:, 0] > 0, m[:, 0] + np.log(np.where(l[:, 0] > 0, l[:, 0], 1)), -np.inf)
    return o, lse


def numpy_data(p: Problem, *, seed=0, rows=None, scale=1.0) -> ProblemData:
    rng = np.random.default_rng(seed)
    q, k, v = (
        from_float32(rng.standard_normal(s).astype(np.float32) * np.float32(scale), p.dtype)
        for s in (
            (p.batch, p.seqlen_q, p.heads_q, p.head_dim),
            (p.batch, p.seqlen_k, p.heads_kv, p.head_dim),
            (p.batch, p.seqlen_k, p.heads_kv, p.head_dim),
        )
    )
    ref_o, ref_lse = reference_problem(q, k, v, p, softmax_scale(p), rows=rows)
    return ProblemData(q=q, k=k, v=v, rows=rows, ref_o=ref_o, ref_lse=ref_lse, seed=seed)


def kernel_output(data: ProblemData, p: Problem):
    """What a correct kernel writes: the exact result rounded to the storage type, on every row."""
    full_o, full_lse = reference_problem(data.q, data.k, data.v, p, softmax_scale(p))
    return from_float32(full_o, p.dtype), full_lse.copy()


CAUSAL_GQA = Problem(batch=2, seqlen_q=70, seqlen_k=50, heads_q=4, heads_kv=2, head_dim=64, causal=True)


@pytest.mark.parametrize(
    "problem",
    [
        CAUSAL_GQA,
        Problem(batch=1, seqlen_q=33, seqlen_k=90, heads_q=2, head_dim=64, dtype="bf16", causal=True),
        Problem(batch=2, seqlen_q=40, heads_q=3, head_dim=32, dtype="bf16"),
    ],
)
def test_the_reference_is_attention_of_every_head_in_the_kernels_layout(problem):
    p = problem
    rows = np.array([0, 5, 21, p.seqlen_q - 1])
    for picked in (None, rows):
        data = numpy_data(p, rows=picked, scale=2.0)
        r = np.arange(p.seqlen_q) if picked is None else picked
        assert data.ref_o.shape == (p.batch, len(r), p.heads_q, p.head_dim) and data.ref_o.dtype == np.float32
        assert data.ref_lse.shape == (p.batch, p.heads_q, len(r)) and data.ref_lse.dtype == np.float32
        group = p.heads_q // p.heads_kv
        for b in range(p.batch):
            for h in range(p.heads_q):
                qh, kh, vh = (
                    to_float32(x, p.dtype)
                    for x in (data.q[b, :, h], data.k[b, :, h // group], data.v[b, :, h // group])
                )
                o, lse = naive_attention(qh, kh, vh, softmax_scale(p), p.causal)
                np.testing.assert_allclose(data.ref_o[b, :, h], o[r], rtol=1e-4, atol=1e-5)
                np.testing.assert_allclose(data.ref_lse[b, h], lse[r], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_a_correct_output_passes_the_check(dtype):
    p = Problem(**{**CAUSAL_GQA.to_dict(), "dtype": dtype})
    data = numpy_data(p)
    o, lse = kernel_output(data, p)
    failure, rel, lse_err = check_output(p, data, o, lse)
    assert failure is None, failure
    assert 0 < rel < TOLERANCES[dtype][0] and 0 <= lse_err < TOLERANCES[dtype][1]


def nan_bits(dtype):
    return np.uint16(0x7FC0) if dtype == "bf16" else np.float16("nan")


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (lambda o, lse, d: o.__setitem__((1, 60, 2, 7), nan_bits(d)), "1 of 35840 output elements are unwritten"),
        (lambda o, lse, d: lse.__setitem__((0, 3, 44), np.nan), "1 of 560 LSE values are unwritten or NaN"),
        (
            lambda o, lse, d: o.__setitem__((0, 4, 1, 0), from_float32(np.full(1, 0.5, np.float32), d)[0]),
            "rows that see no key",
        ),
        (lambda o, lse, d: lse.__setitem__((1, 0, 3), 0.0), "rows that see no key"),
        (lambda o, lse, d: lse.__setitem__((1, 0, 25), -np.inf), "LSE is -inf on a row that sees keys"),
        (
            lambda o, lse, d: o.__setitem__((1, slice(None), 3), from_float32(to_float32(o[1, :, 3], d) * 1.1, d)),
            "O relative error .* at batch 1, head 3",
        ),
        (lambda o, lse, d: lse.__setitem__((0, 2, 60), lse[0, 2, 60] + 0.01), "LSE error .* at batch 0, head 2"),
    ],
)
def test_each_way_of_being_wrong_fails_the_check(dtype, spoil, message):
    import re

    p = Problem(**{**CAUSAL_GQA.to_dict(), "dtype": dtype})  # rows 0..19 see no key
    data = numpy_data(p, seed=3)
    o, lse = kernel_output(data, p)
    spoil(o, lse, dtype)
    failure, _, _ = check_output(p, data, o, lse)
    assert failure is not None and re.search(message, failure), failure


def test_a_strided_check_compares_the_checked_rows_of_every_head():
    p = Problem(batch=2, seqlen_q=64, heads_q=3, head_dim=32)
    rows = np.union1d(np.arange(1, 64, 4), [63])
    data = numpy_data(p, rows=rows)
    o, lse = kernel_output(data, p)
    assert check_output(p, data, o, lse)[0] is None
    spoilt = o.copy()
    spoilt[1, 5, 2] = spoilt[1, 5, 2] * np.float16(3)  # a checked row of the last head
    assert "batch 1, head 2" in check_output(p, data, spoilt, lse)[0]
    spoilt = lse.copy()
    spoilt[1, 2, 4] += 1.0  # a row the stride leaves out
    assert check_output(p, data, o, spoilt)[0] is None


def test_the_check_reports_the_worst_errors():
    p = Problem(batch=1, seqlen_q=40, heads_q=2, head_dim=32)
    data = numpy_data(p)
    o, lse = kernel_output(data, p)
    _, base_rel, _ = check_output(p, data, o, lse)
    lse[0, 1, 7] += 5e-4  # within the tolerance: passes, and is the worst LSE error
    failure, rel, lse_err = check_output(p, data, o, lse)
    assert failure is None and rel == base_rel and lse_err == pytest.approx(5e-4, rel=1e-2)


# -- the input cache --------------------------------------------------------------------------------


class FakeBuild:
    def __init__(self):
        self.calls = []

    def __call__(self, problem, input_scale, data_seed):
        self.calls.append((problem, input_scale, data_seed))
        return {"problem": problem, "scale": input_scale, "seed": data_seed}


P1, P2, P3 = (Problem(batch=1, seqlen_q=n, heads_q=2, head_dim=64) for n in (128, 256, 512))


def test_a_problem_is_made_once_and_reused():
    build = FakeBuild()
    cache = InputCache(build, capacity=2, salt=7)
    first, reused = cache.get(P1, 1.0, 0)
    assert not reused and len(build.calls) == 1
    again, reused = cache.get(P1, 1.0, 0)
    assert reused and again is first and len(build.calls) == 1
    for other in ((P1, 3.0, 0), (P1, 1.0, 1), (P2, 1.0, 0)):  # scale, job seed and problem are all in the key
        data, reused = cache.get(*other)
        assert not reused and data["problem"] == other[0] and data["scale"] == other[1]
    assert len(build.calls) == 4
    assert cache.get(P1, 1.0, 1)[0]["seed"] != first["seed"]  # another job seed, other data


def test_the_cache_keeps_the_last_problems_only():
    build = FakeBuild()
    cache = InputCache(build, capacity=2, salt=7)
    a, _ = cache.get(P1, 1.0, 0)
    cache.get(P2, 1.0, 0)
    cache.get(P1, 1.0, 0)  # P1 used last: P2 is the oldest
    cache.get(P3, 1.0, 0)
    assert len(cache) == 2
    assert cache.get(P1, 1.0, 0) == (a, True)
    _, reused = cache.get(P2, 1.0, 0)
    assert not reused and len(build.calls) == 4


def test_fresh_inputs_are_new_each_time_and_not_kept():
    build = FakeBuild()
    cache = InputCache(build, capacity=2, salt=7)
    kept, _ = cache.get(P1, 1.0, 0)
    seeds = {cache.get(P1, 1.0, 0, fresh=True)[0]["seed"] for _ in range(5)}
    assert len(seeds) == 5 and kept["seed"] not in seeds
    assert len(cache) == 1 and cache.get(P1, 1.0, 0) == (kept, True)


def test_each_process_draws_other_data_but_one_process_the_same():
    a, b = InputCache(FakeBuild()), InputCache(FakeBuild())  # two workers (or a restart): salts drawn at random
    assert a.salt != b.salt
    assert a.get(P1, 1.0, 0)[0]["seed"] != b.get(P1, 1.0, 0)[0]["seed"]
    same = InputCache(FakeBuild(), salt=a.salt)
    assert same.get(P1, 1.0, 0)[0]["seed"] == a.get(P1, 1.0, 0)[0]["seed"]
    assert a.data_seed(-3) != a.data_seed(3) and a.data_seed(0) >= 0


def test_discarded_data_is_made_again():
    build = FakeBuild()
    cache = InputCache(build, capacity=2, salt=7)
    a, _ = cache.get(P1, 1.0, 0)
    cache.get(P2, 1.0, 0)
    cache.discard(a)
    assert len(cache) == 1
    again, reused = cache.get(P1, 1.0, 0)
    assert not reused and again is not a and len(build.calls) == 3
    cache.discard({"not": "kept"})  # unknown data: nothing happens
    assert len(cache) == 2


def test_a_cache_needs_room_for_one_problem():
    with pytest.raises(ValueError, match="capacity"):
        InputCache(FakeBuild(), capacity=0)


# -- when timing stops ------------------------------------------------------------------------------


def coverage(n: int, rank: int) -> Fraction:
    """P(x(rank) <= median <= x(n + 1 - rank)) for n samples of any continuous distribution."""
    below = sum(math.comb(n, j) for j in range(rank))  # P(Binomial(n, 1/2) < rank)
    return 1 - 2 * Fraction(below, 2**n)


@pytest.mark.parametrize("n", [*range(1, 40), 50, 99, 100, 101, 500])
def test_the_median_interval_is_the_narrowest_that_covers_95_percent(n):
    rank = median_ci_rank(n)
    if n < 6:
        assert rank is None  # 2 / 2^5 > 5%: no interval of fewer than 6 samples has 95%
        return
    assert coverage(n, rank) >= Fraction(95, 100)
    assert rank == n // 2 + 1 or coverage(n, rank + 1) < Fraction(95, 100)


def test_known_ranks_of_the_median_interval():
    assert [median_ci_rank(n) for n in (6, 10, 20, 100)] == [1, 2, 6, 40]  # textbook tables


def test_the_interval_covers_the_true_median_as_often_as_it_claims():
    rng = np.random.default_rng(1)
    for n in (10, 30, 100):
        hits = 0
        for _ in range(2000):
            stats = timing_stats(rng.lognormal(0.0, 0.05, n))  # true median exp(0) = 1
            hits += stats.ci_low_ms <= 1.0 <= stats.ci_high_ms
        assert hits / 2000 >= 0.94


def test_timing_stats_of_known_samples():
    stats = timing_stats([1.0, 2.0, 3.0, 4.0, 100.0, 5.0, 6.0, 7.0, 8.0, 9.0])
    assert stats.median_ms == 5.5 and stats.reps == 10
    assert (stats.ci_low_ms, stats.ci_high_ms) == (2.0, 9.0)
    assert stats.rel_ci == pytest.approx(3.5 / 5.5)
    assert stats.spread == pytest.approx((7.75 - 3.25) / 5.5)
    assert timing_stats([2.0, 2.0, 2.0]).rel_ci is None
    with pytest.raises(ValueError):
        timing_stats([])


SETTINGS = MeasureSettings()


def simulate(draw, *, per_launch_ms: float, settings: MeasureSettings = SETTINGS) -> list[float]:
    """The timing loop of tuner.gpu._timing.time_kernel with synthetic samples and a synthetic clock."""
    samples: list[float] = []
    batches = 0
    while (
        n := next_batch(
            samples,
            spent_ms=len(samples) * per_launch_ms,
            min_reps=settings.min_reps,
            max_reps=settings.max_reps,
            budget_ms=settings.target_ms,
            rel_ci=settings.rel_ci,
        )
    ) > 0:
        samples += [draw(len(samples) + i) for i in range(n)]
        batches += 1
        assert batches < 100
    return samples


def test_stable_samples_stop_at_the_minimum():
    rng = np.random.default_rng(0)
    samples = simulate(lambda i: 0.5 * rng.lognormal(0, 0.003), per_launch_ms=0.55)
    assert len(samples) == SETTINGS.min_reps
    stats = timing_stats(samples)
    assert stats.rel_ci <= SETTINGS.rel_ci and stats.median_ms == pytest.approx(0.5, rel=0.01)
    assert len(samples) * 0.55 < 10  # a 0.5 ms kernel: a few ms of timing, not a second


def test_moderate_noise_takes_more_launches_until_the_median_is_known():
    rng = np.random.default_rng(0)
    samples = simulate(lambda i: 0.5 * rng.lognormal(0, 0.03), per_launch_ms=0.55)
    stats = timing_stats(samples)
    assert SETTINGS.min_reps < len(samples) < SETTINGS.target_ms / 0.55
    assert stats.rel_ci <= SETTINGS.rel_ci and stats.median_ms == pytest.approx(0.5, rel=0.02)


def test_noisy_samples_run_to_the_time_cap():
    rng = np.random.default_rng(0)
    samples = simulate(lambda i: 0.5 * rng.lognormal(0, 0.2), per_launch_ms=0.55)
    cap = SETTINGS.target_ms / 0.55
    assert 0.75 * cap <= len(samples) <= cap
    assert timing_stats(samples).rel_ci > SETTINGS.rel_ci


def test_noisy_fast_samples_run_to_the_launch_cap():
    rng = np.random.default_rng(0)
    settings = MeasureSettings(max_reps=300)
    samples = simulate(lambda i: 0.01 * rng.lognormal(0, 0.3), per_launch_ms=0.05, settings=settings)
    assert len(samples) == 300


def test_outliers_move_neither_the_median_nor_the_stop():
    rng = np.random.default_rng(0)
    # every 5th launch is 5x slower (a preempted launch, a clock dip): 20% outliers
    samples = simulate(lambda i: 0.5 * rng.lognormal(0, 0.003) * (5 if i % 5 == 0 else 1), per_launch_ms=0.55)
    stats = timing_stats(samples)
    assert len(samples) <= 2 * SETTINGS.min_reps
    assert stats.median_ms == pytest.approx(0.5, rel=0.01) and stats.rel_ci <= SETTINGS.rel_ci


def test_a_long_kernel_still_gets_the_minimum_and_no_more():
    samples = simulate(lambda i: 50.0 * (1 + 0.05 * (-1) ** i), per_launch_ms=50.0)
    assert len(samples) == SETTINGS.min_reps  # 500 ms > the cap, but the minimum holds


def test_the_launch_count_respects_small_limits():
    assert next_batch([], spent_ms=0, min_reps=3, max_reps=5, budget_ms=100, rel_ci=0.01) == 3
    assert next_batch([1.0, 1.1, 1.2], spent_ms=3, min_reps=3, max_reps=5, budget_ms=100, rel_ci=0.01) == 2
    assert next_batch([1.0] * 5, spent_ms=5, min_reps=3, max_reps=5, budget_ms=100, rel_ci=0.01) == 0
    assert next_batch([], spent_ms=0, min_reps=0, max_reps=5, budget_ms=100, rel_ci=0.01) == 1
    assert next_batch([], spent_ms=0, min_reps=50, max_reps=5, budget_ms=100, rel_ci=0.01) == 5


def test_a_batch_at_most_doubles_the_samples():
    noisy = list(np.random.default_rng(0).lognormal(0, 0.3, 10))
    assert next_batch(noisy, spent_ms=10, min_reps=10, max_reps=1000, budget_ms=1e6, rel_ci=0.01) == 10
    assert next_batch(noisy, spent_ms=95, min_reps=10, max_reps=1000, budget_ms=100, rel_ci=0.01) == 0


def test_warm_up_is_about_the_asked_time():
    assert warmup_launches(5.0, 0.5) == 10
    assert warmup_launches(5.0, 20.0) == 1
    assert warmup_launches(5.0, 0.001) == MAX_WARMUP_LAUNCHES
    assert warmup_launches(0.0, 0.5) == 1
    assert warmup_launches(5.0, 0.0) == MAX_WARMUP_LAUNCHES


# -- the messages ------------------------------------------------------------------------------------

OLD_RESULT_KEYS = {"status", "detail", "latency_ms", "spread", "reps", "tflops", "rel_error", "lse_error"}


def test_results_keep_every_stored_key_and_add_the_accounting():
    d = MeasureResult(
        status="ok",
        latency_ms=0.5,
        kernel_ms=12.0,
        job_ms=30.0,
        rel_ci=0.004,
        phases_ms={"load": 1.0, "inputs": 0.0, "check": 2.0, "timing": 25.0},
    ).to_dict()
    assert set(d) >= OLD_RESULT_KEYS
    assert set(d) - OLD_RESULT_KEYS == {"rel_ci", "kernel_ms", "job_ms", "phases_ms"}
    old = {
        "status": "ok",
        "detail": "",
        "latency_ms": 1.0,
        "spread": 0.01,
        "reps": 50,
        "tflops": 300.0,
        "rel_error": 1e-4,
        "lse_error": 1e-5,
    }
    assert MeasureResult(**old).to_dict() == {**old, "rel_ci": None, "kernel_ms": None, "job_ms": None, "phases_ms": {}}


def test_settings_reuse_kept_inputs_unless_asked():
    assert not MeasureSettings().fresh_inputs and MeasureSettings(fresh_inputs=True).fresh_inputs
    s = MeasureSettings()
    assert s.min_reps >= 6 and s.min_reps <= s.max_reps and 0 < s.rel_ci < 0.05 and s.target_ms > 0


# -- the dtype table ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_every_dtype_is_stored_poisoned_and_converted_as_its_table_row_says(dtype):
    from tuner.gpu._tensors import poison, storage_dtype
    from tuner.gpu._tma import CU_TENSOR_MAP_DATA_TYPE

    spec = DTYPES[dtype]
    assert storage_dtype(dtype) == np.dtype(spec.storage) and np.dtype(spec.storage).itemsize == spec.bytes
    x = np.zeros(4, dtype=storage_dtype(dtype))
    poison(x, dtype)
    assert x.view(np.uint16).tolist() == [spec.nan_bits] * 4 and np.isnan(to_float32(x, dtype)).all()
    values = np.array([1.0, -2.5, 0.15625], dtype=np.float32)  # exact in both 16-bit types
    assert to_float32(from_float32(values, dtype), dtype).tolist() == values.tolist()
    assert CU_TENSOR_MAP_DATA_TYPE[dtype] == spec.tma_data_type
    assert dtype in TOLERANCES


def test_bf16_is_rounded_to_nearest_even_from_its_table_row():
    assert DTYPES["bf16"].storage == "uint16"  # NumPy has no bfloat16: the bits
    halfway = np.array([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8], dtype=np.float32)  # ties between bf16 neighbours
    assert to_float32(from_float32(halfway, "bf16"), "bf16").tolist() == [1.0, 1.0 + 2 * 2.0**-7]
