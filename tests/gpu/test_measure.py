"""One measurement on a real GPU: a problem's inputs and reference made once and kept, fresh ones on
request, adaptive timing and the accounting of where a job's time goes (tuner.gpu.CupyHandler)."""

from __future__ import annotations

import statistics
import time

import pytest

from tuner.gpu import GEMM_COOLDOWN_S, GEMM_PEER, PEER_NAMES, MeasureSettings
from tuner.problem import Problem
from tuner.run import WorkerError

pytestmark = pytest.mark.gpu

PROBLEM = Problem(batch=4, seqlen_q=2048, heads_q=16, head_dim=128, causal=True)  # about 0.3 ms on an H200
SEED = 4242  # a key no other module's jobs use: the first job here makes the inputs


@pytest.fixture(scope="module")
def job_for(device):
    from tuner.compile import compile_config
    from tuner.gpu import measure_job_for
    from tuner.space import load_space

    space = load_space("sm80")
    config = space.defaults(PROBLEM.head_dim)
    kernel = compile_config(space, config, PROBLEM, device)

    def job(**settings):
        return measure_job_for(
            space, config, PROBLEM, device, kernel, MeasureSettings(**{"seed": SEED, **settings}), tag="measure"
        )

    return job


def test_a_problem_s_inputs_are_made_once_and_fresh_ones_on_request(worker, job_for):
    first = worker.measure(job_for(timing=False))
    assert first.ok, first.detail
    assert first.phases_ms["inputs"] > 0
    kept = worker.measure(job_for(timing=False))
    assert kept.ok and kept.phases_ms["inputs"] == 0
    assert kept.rel_error == first.rel_error  # the same inputs, the same kernel: the same output
    fresh = worker.measure(job_for(timing=False, fresh_inputs=True))
    assert fresh.ok and fresh.phases_ms["inputs"] > 0 and fresh.rel_error != first.rel_error
    again = worker.measure(job_for(timing=False))
    assert again.ok and again.phases_ms["inputs"] == 0 and again.rel_error == first.rel_error
    other_scale = worker.measure(job_for(timing=False, input_scale=3.0))
    assert other_scale.ok and other_scale.phases_ms["inputs"] > 0


def test_a_measurement_accounts_for_its_time(worker, job_for):
    settings = MeasureSettings()
    results = [worker.measure(job_for()) for _ in range(3)]
    for r in results:
        assert r.ok, r.detail
        assert set(r.phases_ms) == {"load", "inputs", "check", "timing"}
        assert settings.min_reps <= r.reps <= settings.max_reps
        assert r.rel_ci is not None and r.rel_ci >= 0 and r.latency_ms > 0 and r.tflops > 0
        # stopped because the median was known, or at a cap
        assert r.rel_ci <= settings.rel_ci or r.reps == settings.max_reps or r.phases_ms["timing"] >= 50
        # every timed launch is in kernel_ms, and the GPU cannot be busier than the job is long
        assert 0.8 * r.latency_ms * r.reps <= r.kernel_ms <= r.job_ms
        assert sum(r.phases_ms.values()) <= r.job_ms + 0.5
        assert r.phases_ms["timing"] < settings.target_ms + settings.warmup_ms + 50  # the time cap holds
    latencies = [r.latency_ms for r in results]
    assert (max(latencies) - min(latencies)) / statistics.median(latencies) < 0.1


def test_peers_are_timed_the_same_way(worker):
    rows = worker.peers(PROBLEM, MeasureSettings(), timeout_s=600)
    if rows[0]["name"] == "pytorch":
        pytest.skip(rows[0]["detail"])
    timed = [r for r in rows if r["latency_ms"]]
    assert any(r["name"].startswith("cublas_gemm") for r in timed)
    for r in timed:
        assert r["reps"] >= MeasureSettings().min_reps and r["rel_ci"] is not None and r["tflops"] > 0
    assert [r["name"] for r in rows] == list(PEER_NAMES)


def test_peers_are_timed_by_name_and_the_card_idles_after_the_gemm(worker):
    """Only the peers asked for, in PEER_NAMES' order; an unknown name is refused; the GEMM's timing is followed by
    GEMM_COOLDOWN_S of idle (its clocks drop: tuner/gpu/_peers.py)."""
    rows = worker.peers(PROBLEM, MeasureSettings(), ("sdpa_cudnn_attention",), timeout_s=600)
    if rows and rows[0]["name"] == "pytorch":
        pytest.skip(rows[0]["detail"])
    assert [r["name"] for r in rows] == ["sdpa_cudnn_attention"]
    start = time.perf_counter()
    rows = worker.peers(PROBLEM, MeasureSettings(), (GEMM_PEER,), timeout_s=600)
    assert [r["name"] for r in rows] == [GEMM_PEER] and rows[0]["tflops"] > 0
    assert time.perf_counter() - start >= GEMM_COOLDOWN_S
    with pytest.raises(WorkerError, match="unknown peers"):
        worker.peers(PROBLEM, MeasureSettings(), ("sdpa_math",), timeout_s=600)


def test_preparing_a_problem_makes_its_inputs_before_the_first_job(worker, job_for):
    settings = MeasureSettings(seed=SEED + 1)
    ms = worker.prepare(PROBLEM, settings, timeout_s=300)
    assert ms > 0
    first = worker.measure(job_for(timing=False, seed=SEED + 1))
    assert first.ok, first.detail
    assert first.phases_ms["inputs"] == 0  # made by prepare, kept for the jobs
