"""``tuner.attention`` on a real GPU: CuPy arrays and PyTorch tensors, fp16/bf16, causal or not, against fp32.

Skipped with the reason where there is no GPU (tests/gpu/conftest.py); the PyTorch cases also
where PyTorch is not installed.
"""

from __future__ import annotations

import math

import pytest

import tuner
from tuner.gpu import TOLERANCES
from tuner.problem import Problem
from tuner.space import available_families, load_space

from .conftest import no_gpu_reason

# a module-level skip, so that no GPU fixture is set up where there is no GPU
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(no_gpu_reason() is not None, reason=str(no_gpu_reason()))]

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim)
# the last: d256 with GQA, whose causal default (the [[defaults]] rules) is persistent with one Q stage and 64-key blocks
SHAPES = [(2, 257, 257, 4, 2, 128), (1, 100, 300, 2, 2, 64), (1, 300, 300, 4, 2, 256)]


@pytest.fixture(scope="module")
def device():
    from tuner.devices import DeviceLimits
    from tuner.gpu._info import gpu_info

    return DeviceLimits.from_info(gpu_info())


@pytest.fixture(params=available_families())
def family(request, device):
    space = load_space(request.param)
    reason = space.runs_on(device.arch)
    if reason:
        pytest.skip(reason)
    return request.param


def check(problem: Problem, q, k, v, o, lse) -> None:
    """O and LSE (CuPy, o in storage dtype) against the float32 reference, head by head."""
    import cupy

    from tuner.gpu._reference import reference_head
    from tuner.gpu._tensors import to_float32

    o_tol, lse_tol = TOLERANCES[problem.dtype]
    scale = 1.0 / math.sqrt(problem.head_dim)
    group = problem.heads_q // problem.heads_kv
    of = to_float32(o, problem.dtype)
    for b in range(problem.batch):
        for h in range(problem.heads_q):
            qh, kh, vh = (to_float32(x, problem.dtype) for x in (q[b, :, h], k[b, :, h // group], v[b, :, h // group]))
            ref_o, ref_lse = reference_head(qh, kh, vh, scale, problem.causal)
            rel = float(cupy.linalg.norm(of[b, :, h] - ref_o) / max(float(cupy.linalg.norm(ref_o)), 1e-30))
            assert rel <= o_tol, f"O relative error {rel:.3g} at batch {b}, head {h}"
            live = cupy.isfinite(ref_lse)
            assert bool((cupy.isneginf(lse[b, h]) == ~live).all()), "LSE must be -inf exactly on rows that see no key"
            if bool(live.any()):
                err = float(cupy.abs(lse[b, h][live] - ref_lse[live]).max())
                assert err <= lse_tol, f"LSE error {err:.3g} at batch {b}, head {h}"


def _problem(shape, dtype, causal) -> Problem:
    b, nq, nk, hq, hk, d = shape
    return Problem(batch=b, seqlen_q=nq, seqlen_k=nk, heads_q=hq, heads_kv=hk, head_dim=d, dtype=dtype, causal=causal)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cupy_arrays(family, shape, dtype, causal):
    import cupy

    from tuner.gpu._tensors import random_inputs

    problem = _problem(shape, dtype, causal)
    if load_space(family).supports(problem):
        pytest.skip(load_space(family).supports(problem))
    q, k, v = random_inputs(problem, seed=1)
    o, lse = tuner.attention(q, k, v, causal=causal, family=family, return_lse=True)
    assert isinstance(o, cupy.ndarray) and o.dtype == q.dtype and o.shape == q.shape
    assert lse.dtype == cupy.float32 and lse.shape == (problem.batch, problem.heads_q, problem.seqlen_q)
    cupy.cuda.Device().synchronize()
    check(problem, q, k, v, o, lse)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_torch_tensors_zero_copy(family, dtype, causal):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import cupy

    problem = _problem(SHAPES[0], dtype, causal)
    torch_dtype = torch.float16 if dtype == "fp16" else torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(2)
    b, nq, nk, hq, hk, d = SHAPES[0]
    # q is a strided view into a packed [B, N, 2, H, D] tensor: no copy may be needed for it
    packed = torch.randn(b, nq, 2, hq, d, device="cuda", dtype=torch_dtype, generator=gen)
    q = packed[:, :, 0]
    k = torch.randn(b, nk, hk, d, device="cuda", dtype=torch_dtype, generator=gen)
    v = torch.randn(b, nk, hk, d, device="cuda", dtype=torch_dtype, generator=gen)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the kernel must run on the caller's current stream
        o, lse = tuner.attention(q, k, v, causal=causal, family=family, return_lse=True)
        o.mul_(1)  # ordered after the kernel on the same stream
    torch.cuda.current_stream().wait_stream(side)
    assert isinstance(o, torch.Tensor) and o.dtype == torch_dtype and o.shape == q.shape and o.device == q.device
    assert lse.dtype == torch.float32 and tuple(lse.shape) == (b, hq, nq)
    torch.cuda.synchronize()

    def bits(t):
        return cupy.from_dlpack(t.contiguous() if dtype == "fp16" else t.contiguous().view(torch.int16)).view(
            cupy.float16 if dtype == "fp16" else cupy.uint16
        )

    check(problem, bits(q), bits(k), bits(v), bits(o), cupy.from_dlpack(lse))


def test_exported_header_config(family, device, tmp_path):
    """A config given as the path of a header written by ``flashtune export`` runs and is correct."""
    import cupy

    from tests.fake_studies import make_study
    from tuner.export import render_header
    from tuner.gpu._tensors import random_inputs
    from tuner.study import choose

    problem = _problem(SHAPES[0], "fp16", True)
    study = make_study(f"sqlite:///{tmp_path}/s.db", "gpu-export", family, problem, n_trials=12, failures=False)
    chosen = choose(study)
    header = tmp_path / "best.h"
    header.write_text(render_header(chosen, storage_url="sqlite:///s.db"))
    q, k, v = random_inputs(problem, seed=3)
    o, lse = tuner.attention(q, k, v, causal=True, family=family, config=header, return_lse=True)
    cupy.cuda.Device().synchronize()
    check(problem, q, k, v, o, lse)


def test_bad_inputs_are_refused_clearly(family):
    import cupy

    from tuner.serve import AttentionError

    q = cupy.zeros((1, 16, 2, 128), dtype=cupy.float16)
    with pytest.raises(AttentionError, match="CuPy arrays or PyTorch tensors"):
        tuner.attention(q.get(), q.get(), q.get(), family=family)
    with pytest.raises(AttentionError, match="float16"):
        tuner.attention(q.astype(cupy.float32), q, q, family=family)
    with pytest.raises(AttentionError, match="same shape"):
        tuner.attention(q, q, q[:, :8], family=family)
    with pytest.raises(AttentionError, match="head dims"):
        tuner.attention(*(cupy.zeros((1, 16, 2, 96), dtype=cupy.float16),) * 3, family=family)
    with pytest.raises(Exception, match="not one of"):
        tuner.attention(q, q, q, family=family, config={load_space(family).knobs[0].name: 12345})


def test_misaligned_views_are_copied_not_misread(family):
    """Views whose strides are not multiples of 16 bytes cannot feed 16-byte loads: the result must still be right."""
    import cupy

    from tuner.gpu._tensors import random_inputs

    problem = _problem(SHAPES[0], "fp16", False)
    q, k, v = random_inputs(problem, seed=4)
    b, n, h, d = q.shape
    padded = cupy.zeros((b, n, h, d + 1), dtype=q.dtype)  # rows of 2*(d+1) bytes: not 16-byte multiples
    padded[..., :d] = q
    view = padded[..., :d]
    assert view.strides[2] % 16 != 0
    o, lse = tuner.attention(view, k, v, family=family, return_lse=True)
    cupy.cuda.Device().synchronize()
    check(problem, q, k, v, o, lse)


def test_a_contiguous_but_misaligned_array_is_copied(family):
    """A C-contiguous array whose base is not 16-byte aligned (an offset into a larger buffer)."""
    import cupy

    from tuner.gpu._tensors import random_inputs

    problem = _problem(SHAPES[0], "fp16", False)
    q, k, v = random_inputs(problem, seed=5)
    flat = cupy.zeros(q.size + 1, dtype=q.dtype)
    shifted = flat[1:].reshape(q.shape)  # 2 bytes past an aligned base
    shifted[...] = q
    assert shifted.flags.c_contiguous and shifted.data.ptr % 16 != 0
    o, lse = tuner.attention(shifted, k, v, family=family, return_lse=True)
    cupy.cuda.Device().synchronize()
    check(problem, q, k, v, o, lse)


def test_torch_inputs_copied_on_the_callers_stream(family):
    """A misaligned PyTorch view is copied by PyTorch on the caller's (non-default) stream, before the kernel."""
    import torch

    problem = _problem(SHAPES[1], "bf16", True)
    b, n, h, d = problem.batch, problem.seqlen_q, problem.heads_q, problem.head_dim
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        padded = torch.randn(b, n, h, d + 8, device="cuda", dtype=torch.bfloat16)
        q = padded[..., 1 : d + 1]  # last dimension contiguous, base 2 bytes off
        k = torch.randn(b, problem.seqlen_k, problem.heads_kv, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        o = tuner.attention(q, k, v, causal=True, family=family)
    stream.synchronize()
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float().transpose(1, 2),
        k.float().transpose(1, 2).repeat_interleave(h // problem.heads_kv, 1),
        v.float().transpose(1, 2).repeat_interleave(h // problem.heads_kv, 1),
        attn_mask=torch.ones(n, problem.seqlen_k, device="cuda", dtype=torch.bool).tril(problem.seqlen_k - n),
    ).transpose(1, 2)
    rel = float((o.float() - ref).norm() / ref.norm())
    assert rel <= TOLERANCES["bf16"][0], rel


# -- the cached path: CUDA graphs, the torch op, torch.compile, host time, config="auto" ------------------
def torch_reference(q, k, v, causal: bool, scale: float | None = None):
    """O in float32 from SDPA's math on float32 copies, with flashtune's bottom-right causal mask."""
    import torch

    n, nk, h, hk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    mask = torch.ones(n, nk, device=q.device, dtype=torch.bool).tril(nk - n) if causal else None
    return torch.nn.functional.scaled_dot_product_attention(
        q.float().transpose(1, 2),
        k.float().transpose(1, 2).repeat_interleave(h // hk, 1),
        v.float().transpose(1, 2).repeat_interleave(h // hk, 1),
        attn_mask=mask,
        scale=scale,
    ).transpose(1, 2)


def assert_close_to_reference(o, q, k, v, causal, scale=None) -> None:
    import torch

    ref = torch_reference(q, k, v, causal, scale)
    live = ref.isfinite().all(-1)  # rows that see no key are 0 in O; SDPA gives NaN there
    rel = float((o.float()[live] - ref[live]).norm() / ref[live].norm())
    tol = TOLERANCES["fp16" if o.dtype == torch.float16 else "bf16"][0]
    assert rel <= tol, rel


def test_cuda_graph_capture_replays_calls_on_new_inputs(family):
    """Several calls (two shapes, the function and the operator) captured once, replayed on fresh inputs."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    tuner.serve.register_torch_op()  # torch.ops.flashtune.attention, and tuner.attention traced as it

    space = load_space(family)
    shapes = [s for s in SHAPES if not space.supports(_problem(s, "bf16", True))]
    static = [
        tuple(
            torch.randn(b, n if i == 0 else nk, hq if i == 0 else hk, d, device="cuda", dtype=torch.bfloat16)
            for i in range(3)
        )
        for b, n, nk, hq, hk, d in shapes
    ]

    def calls():
        outs = []
        for q, k, v in static:
            outs.append((tuner.attention(q, k, v, causal=True, family=family), (q, k, v), True, None))
            o, _ = torch.ops.flashtune.attention(q, k, v, False, 0.05, family)
            outs.append((o, (q, k, v), False, 0.05))
        return outs

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: every plan is built before the capture
        calls()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = calls()
    for seed in (11, 12):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        for tensors in static:
            for t in tensors:
                t.copy_(torch.randn(t.shape, device="cuda", dtype=t.dtype, generator=gen))
        graph.replay()
        torch.cuda.synchronize()
        for o, (q, k, v), causal, scale in captured:
            assert_close_to_reference(o, q, k, v, causal, scale)


def test_a_first_call_inside_a_capture_is_refused_and_the_context_survives(family):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    from tuner.serve import AttentionError

    q, k, v = (torch.randn(1, 72, 2, 128, device="cuda", dtype=torch.float16) for _ in range(3))  # a new shape
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(AttentionError, match="warm-up"), torch.cuda.graph(graph):
        tuner.attention(q, k, v, family=family)
    torch.cuda.synchronize()
    o = tuner.attention(q, k, v, family=family)
    torch.cuda.synchronize()
    assert_close_to_reference(o, q, k, v, False)


def test_torch_compile_fullgraph_gives_the_eager_result(family):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    tuner.serve.register_torch_op()  # torch.ops.flashtune.attention, and tuner.attention traced as it

    q, k, v = (torch.randn(2, 256, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))

    def model(q, k, v):
        o, lse = torch.ops.flashtune.attention(q * 2, k, v, True, None, family)
        return tuner.attention(o, k, v, family=family) + 1, lse

    eager = model(q, k, v)
    compiled = torch.compile(model, fullgraph=True)(q, k, v)
    torch.testing.assert_close(compiled[0], eager[0])
    torch.testing.assert_close(compiled[1], eager[1])


def test_inputs_that_require_grad_are_refused(family):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    tuner.serve.register_torch_op()  # torch.ops.flashtune.attention, and tuner.attention traced as it
    from tuner.serve import AttentionError

    q, k, v = (torch.randn(1, 64, 2, 128, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    with pytest.raises(AttentionError, match="forward-only"):
        tuner.attention(q, k, v, family=family)
    with pytest.raises(AttentionError, match="forward-only"):
        torch.ops.flashtune.attention(q, k, v, False, None, family)
    with torch.no_grad():
        assert_close_to_reference(tuner.attention(q, k, v, family=family), q, k, v, False)


def test_host_time_per_cached_call_is_within_the_target(family):
    """Issue 9's target: a cached call with PyTorch tensors costs no more host time than SDPA's on the same
    machine, in the same run (20 us on the H200 host it was set on, where SDPA took 25-29 us)."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import torch.nn.functional as F

    from tuner.bench import HOST_US_TARGET, host_us_per_call

    q, k, v = (torch.randn(8, 2048, 16, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    with torch.inference_mode():
        tuner.attention(q, k, v, family=family)
        F.scaled_dot_product_attention(qt, kt, vt)
        # the best of 5 interleaved measurements of each: the device host's own jitter moves PyTorch's SDPA
        # from 18 to 28 us within seconds, so back-to-back blocks of one then the other compare two moments
        ours, theirs = [], []
        for _ in range(5):
            ours.append(host_us_per_call(lambda: tuner.attention(q, k, v, family=family)))
            theirs.append(host_us_per_call(lambda: F.scaled_dot_product_attention(qt, kt, vt)))
        host_us, sdpa_us = min(ours), min(theirs)
    assert host_us <= max(HOST_US_TARGET, sdpa_us), f"{host_us:.1f} us per call, SDPA {sdpa_us:.1f} us"


def test_config_auto_runs_the_tuned_config_of_the_shape(family, tmp_path):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    from tests.fake_studies import make_study
    from tuner.export import build_dispatch, render_dispatch_json
    from tuner.serve import load_tuned
    from tuner.study import choose

    problem = _problem(SHAPES[0], "fp16", True)
    study = make_study(f"sqlite:///{tmp_path}/s.db", "gpu-auto", family, problem, n_trials=12, failures=False)
    families = build_dispatch([choose(study)])
    (tmp_path / "dispatch.json").write_text(render_dispatch_json(families, storage_url="sqlite:///s.db"))
    b, n, nk, hq, hk, d = SHAPES[0]
    q = torch.randn(b, n, hq, d, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(b, nk, hk, d, device="cuda", dtype=torch.float16) for _ in range(2))
    o = tuner.attention(q, k, v, causal=True, family=family, config="auto", tuned=tmp_path / "dispatch.json")
    torch.cuda.synchronize()
    assert_close_to_reference(o, q, k, v, True)
    assert load_tuned(tmp_path / "dispatch.json").config_for(load_space(family), problem) == choose(study).config


def test_bench_api_prints_its_table(family):
    pytest.importorskip("torch", reason="PyTorch is not installed")
    import io

    from tuner.bench import run_api_bench

    out = io.StringIO()
    rows = run_api_bench([Problem(batch=2, seqlen_q=1024, heads_q=8, head_dim=128)], family=family, out=out)
    assert set(rows[0].host_us) == {"tuner", "op", "sdpa"} and all(rows[0].kernel_tflops.values())
    assert "targets:" in out.getvalue() and "fp16-d128-full-b2-h8-n1024" in out.getvalue()


def test_the_dynamic_scheduler_on_streams_and_in_a_cuda_graph(device):
    """sm90 scheduler=1 (units from a tile counter per stream): causal GQA with more units than SMs, launched
    many times in a row on one stream (each kernel must leave its counter zeroed for the next), on two streams at
    once (each its own counter), and captured into a CUDA graph replayed several times."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    space = load_space("sm90")
    if space.runs_on(device.arch):
        pytest.skip(space.runs_on(device.arch))
    dynamic = {"scheduler": 1}
    gen = torch.Generator(device="cuda").manual_seed(5)

    def inputs(n, hq, hk):
        return tuple(
            torch.randn(1, n, h, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for h in (hq, hk, hk)
        )

    a, b = inputs(4096, 28, 4), inputs(1000, 8, 2)  # 896 and 64 units of 128 query rows
    outs = [tuner.attention(*a, causal=True, family="sm90", config=dynamic) for _ in range(6)]
    torch.cuda.synchronize()
    for o in outs:
        assert_close_to_reference(o, *a, causal=True)

    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    for s in (s1, s2):
        s.wait_stream(torch.cuda.current_stream())
    pairs = []
    for _ in range(4):  # queued on both streams without a sync between them
        with torch.cuda.stream(s1):
            pairs.append((tuner.attention(*a, causal=True, family="sm90", config=dynamic), a))
        with torch.cuda.stream(s2):
            pairs.append((tuner.attention(*b, causal=True, family="sm90", config=dynamic), b))
    torch.cuda.synchronize()
    for o, qkv in pairs:
        assert_close_to_reference(o, *qkv, causal=True)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # the plans exist: the capture stream's first launch takes a reserved counter
        captured = [tuner.attention(*qkv, causal=True, family="sm90", config=dynamic) for qkv in (a, b, a)]
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    for o, qkv in zip(captured, (a, b, a)):
        assert_close_to_reference(o, *qkv, causal=True)
    eager = tuner.attention(*a, causal=True, family="sm90", config=dynamic)  # after the replays, on the default stream
    torch.cuda.synchronize()
    assert_close_to_reference(eager, *a, causal=True)
