"""``tuner.sdpa`` and ``tuner.sdpa_patched`` without a GPU.

CPU tensors take PyTorch's SDPA (reason ``cpu``); to reach the other checks and the kernel
path, the stand-in GPU of tests/fakes/standin_launch.py is installed and the tensors count as
CUDA tensors of device 0 (a B200 by the nominal table: family="auto" is sm80 there): what the
kernel would have been launched with (pointers, strides, scale, causal) is checked, and every
fallback's result against PyTorch's own SDPA.
"""

from __future__ import annotations

import importlib
import math
import re
import threading
import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
F = torch.nn.functional

import tuner  # noqa: E402
from tuner.serve import FALLBACK_REASONS, SdpaFallbackWarning, reset_sdpa_fallbacks, sdpa_fallbacks  # noqa: E402

sd = importlib.import_module("tuner.serve._sdpa")
ORIGINAL = F.scaled_dot_product_attention


def bnhd(b=2, n=64, h=4, d=64, dtype=torch.float16, **kw):
    """A [B, H, N, D] transposed view of a contiguous [B, N, H, D] tensor, as models make them."""
    return torch.randn(b, n, h, d, dtype=dtype, **kw).transpose(1, 2)


@pytest.fixture(autouse=True)
def fresh_counts():
    reset_sdpa_fallbacks()
    yield
    reset_sdpa_fallbacks()
    assert F.scaled_dot_product_attention is ORIGINAL


@pytest.fixture
def gpu(monkeypatch):
    """The stand-in GPU under the kernel path; tensors on the CPU count as CUDA device 0 (sm_100: sm80)."""
    pytest.importorskip("cupy", reason="tuner.gpu needs CuPy installed (not a GPU)")
    from tests.fakes.standin_launch import StandInGPU, install

    stand_in = StandInGPU()
    install(monkeypatch, stand_in)
    monkeypatch.setattr(sd, "_cuda_device", lambda q, k, v: 0)
    monkeypatch.setattr(sd, "_device_arch", lambda index: 100)
    yield stand_in
    tuner.serve.clear_cache()


def test_the_signature_is_pytorchs():
    import inspect

    ours = list(inspect.signature(tuner.sdpa).parameters.values())
    assert [(p.name, p.default) for p in ours[:8]] == [
        ("query", inspect.Parameter.empty),
        ("key", inspect.Parameter.empty),
        ("value", inspect.Parameter.empty),
        ("attn_mask", None),
        ("dropout_p", 0.0),
        ("is_causal", False),
        ("scale", None),
        ("enable_gqa", False),
    ]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in ours[8:])


def test_cpu_tensors_fall_back_with_identical_results_counted_and_reported_once():
    q, k, v = bnhd(), bnhd(), bnhd()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for is_causal in (False, True):
            out = tuner.sdpa(q, k, v, is_causal=is_causal, scale=0.3)
            assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=0.3))
    assert sdpa_fallbacks() == {"cpu": 2}
    assert len([w for w in caught if issubclass(w.category, SdpaFallbackWarning)]) == 1


def _cases(q, k, v):
    """(args, kwargs, reason) of a call the kernels cannot run, one or more per reason."""
    return [
        ((q, k, v), {"attn_mask": torch.ones(64, 64, dtype=torch.bool)}, "attn_mask"),
        ((q, k, v), {"dropout_p": 0.1}, "dropout"),
        ((q.float(), k.float(), v.float()), {}, "dtype"),
        ((q, k.bfloat16(), v), {}, "dtype"),
        ((q[..., :32].contiguous(), k[..., :32].contiguous(), v[..., :32].contiguous()), {}, "head_dim"),
        ((q, k, bnhd(d=32)), {}, "head_dim"),
        ((q[0], k[0], v[0]), {}, "shape"),
        ((q, bnhd(h=2), bnhd(h=2)), {}, "shape"),  # fewer K/V heads without enable_gqa: PyTorch's error
        ((q, bnhd(n=32), bnhd(n=32)), {"is_causal": True}, "causal_alignment"),
        ((q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v), {}, "layout"),
        ((q, k.expand(2, 4, 64, 64)[:, :1].expand(2, 4, 64, 64), v), {}, "layout"),
    ]


def test_every_fallback_reason_is_counted_and_gives_pytorchs_result(gpu):
    q, k, v = bnhd(), bnhd(), bnhd()
    seen = set()
    for args, kwargs, reason in _cases(q, k, v):
        try:
            wanted = ORIGINAL(*args, **kwargs) if reason != "dropout" else None
        except RuntimeError as e:  # a call PyTorch refuses: tuner.sdpa raises the same error
            with pytest.raises(RuntimeError, match=re.escape(str(e)[:40])):
                tuner.sdpa(*args, **kwargs)
        else:
            out = tuner.sdpa(*args, **kwargs)
            if wanted is not None:
                assert torch.equal(out, wanted), reason
        seen.add(reason)
        assert sdpa_fallbacks().get(reason), (reason, sdpa_fallbacks())
    with torch.enable_grad():
        qg = q.detach().requires_grad_()
        tuner.sdpa(qg, k, v).float().sum().backward()  # PyTorch's SDPA, with its backward
        assert qg.grad is not None and sdpa_fallbacks()["grad"] == 1
    assert not gpu.launches, "no call reached the kernel"
    assert seen | {"grad", "cpu", "transformers_option"} == set(FALLBACK_REASONS)


def test_transposed_views_reach_the_kernel_without_a_copy(gpu):
    """q, k, v as [B, H, N, D] transposes of [B, N, H, D]: the kernel reads their memory, with their strides."""
    q, k, v = bnhd(n=128, h=8, d=128), bnhd(n=128, h=2, d=128), bnhd(n=128, h=2, d=128)
    out = tuner.sdpa(q, k, v, is_causal=True, enable_gqa=True)
    args = gpu.last["args"]  # flat ABI: q, k, v, o, lse pointers; 5 sizes; q, k, v, o strides (batch, row, head)
    assert args[0:3] == [q.data_ptr(), k.data_ptr(), v.data_ptr()]
    for i, x in enumerate((q, k, v)):
        assert args[10 + 3 * i : 13 + 3 * i] == list(x.transpose(1, 2).stride()[:3])
    assert args[5:10] == [2, 128, 128, 8, 2]
    assert args[22] == pytest.approx(1 / math.sqrt(128))
    problem = gpu.loaded[-1]["problem"]
    assert problem.causal and problem.heads_kv == 2 and gpu.loaded[-1]["family"] == "sm80"
    assert out.shape == (2, 8, 128, 128) and out.transpose(1, 2).is_contiguous()
    assert out.data_ptr() == args[3]  # the kernel's O, returned as its [B, H, N, D] view
    tuner.sdpa(q, k, v, scale=0.125, enable_gqa=True)
    assert gpu.last["args"][22] == pytest.approx(0.125) and not gpu.loaded[-1]["problem"].causal
    assert sdpa_fallbacks() == {}


def test_sdpa_patched_routes_restores_nests_and_passes_options(gpu, monkeypatch):
    calls = []
    real = sd.sdpa
    monkeypatch.setattr(sd, "sdpa", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    q, k, v = bnhd(d=128), bnhd(d=128), bnhd(d=128)
    with tuner.sdpa_patched():
        F.scaled_dot_product_attention(q, k, v)
        with tuner.sdpa_patched(family="sm80", config=None):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        F.scaled_dot_product_attention(q, k, v)
        assert F.scaled_dot_product_attention is not ORIGINAL
    assert F.scaled_dot_product_attention is ORIGINAL
    assert [c["family"] for c in calls] == ["auto", "sm80", "auto"] and calls[1]["config"] is None
    assert len(gpu.launches) == 3


def test_sdpa_patched_from_threads_restores_when_the_last_block_closes():
    barrier = threading.Barrier(4)
    inside = []

    def work():
        with tuner.sdpa_patched():
            barrier.wait()
            inside.append(F.scaled_dot_product_attention is not ORIGINAL)
            q = bnhd()
            F.scaled_dot_product_attention(q, q, q)  # CPU: falls back
            barrier.wait()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert inside == [True] * 4 and F.scaled_dot_product_attention is ORIGINAL
    assert sdpa_fallbacks() == {"cpu": 4}


def test_a_family_without_the_head_dim_falls_back(gpu):
    q = bnhd(d=256)  # sm80 has no d256; on sm_100 no family that runs has one
    out = tuner.sdpa(q, q, q)
    assert torch.equal(out, ORIGINAL(q, q, q)) and sdpa_fallbacks() == {"head_dim": 1}
    sd._head_dims.clear()
    q = bnhd(d=128)
    tuner.sdpa(q, q, q, family="sm80")
    assert len(gpu.launches) == 1


def test_a_cached_call_goes_straight_to_the_launch(gpu, monkeypatch):
    """After the first call of a shape: no plan built, no tuner.attention round trip, the same launch."""
    q, k, v = bnhd(n=96, h=4, d=64), bnhd(n=96, h=4, d=64), bnhd(n=96, h=4, d=64)
    first = tuner.sdpa(q, k, v, is_causal=True)
    launched = dict(gpu.last)
    ta = importlib.import_module("tuner.serve._attention")

    def refuse(*args, **kwargs):
        raise AssertionError("the cached path built a plan or went through tuner.attention")

    monkeypatch.setattr(ta, "_build_plan", refuse)
    monkeypatch.setattr(sd, "attention", refuse)
    again = tuner.sdpa(q, k, v, is_causal=True)
    assert gpu.last["args"][:3] == launched["args"][:3] and gpu.last["args"][5:] == launched["args"][5:]
    assert again.shape == first.shape == (2, 4, 96, 64) and again.stride() == first.stride()
    assert again.transpose(1, 2).is_contiguous() and gpu.last["args"][3] == again.data_ptr()


def test_a_cached_call_costs_less_host_time_than_tuner_attention(gpu, monkeypatch):
    """Host time per cached call with a launch that does nothing: sdpa (its checks and its launch) against
    what a model would do without it, tuner.attention on the [B, N, H, D] views of its [B, H, N, D] tensors
    and the output's view back (interleaved rounds, medians)."""
    import statistics
    import time

    from tuner.gpu import _launch as launch

    monkeypatch.setattr(launch, "launch_kernel", lambda *args: None)
    q, k, v = bnhd(n=128, h=8, d=64), bnhd(n=128, h=8, d=64), bnhd(n=128, h=8, d=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the stand-in B200 has no shipped table: the default serves
        calls = {
            "sdpa": lambda: tuner.sdpa(q, k, v, is_causal=True),
            "attention": lambda: tuner.attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, config="auto"
            ).transpose(1, 2),
        }
        rounds: dict[str, list[float]] = {name: [] for name in calls}
        for call in calls.values():
            call()  # the plan of each path
        for _ in range(15):
            for name, call in calls.items():
                start = time.perf_counter()
                for _ in range(200):
                    call()
                rounds[name].append((time.perf_counter() - start) / 200)
    ours, theirs = (statistics.median(rounds[n]) for n in ("sdpa", "attention"))
    # sdpa through tuner.attention (its checks, then attention's) cost ~1.8x this; its direct path ~0.8x
    assert ours <= theirs, f"sdpa {ours * 1e6:.1f} us vs tuner.attention {theirs * 1e6:.1f} us per call"
