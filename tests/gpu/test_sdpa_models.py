"""``attn_implementation="tuner"`` and ``tuner.sdpa`` on a real GPU (written for an H200), against PyTorch's SDPA.

Small randomly initialised models built from configs here (no downloads): a Llama-style decoder with
grouped-query attention (32 query heads on 8 K/V heads, head dim 128) and a ViT-style encoder (head
dim 64). Each test says what it holds:

- the outputs of ``"tuner"`` and ``"sdpa"`` agree within fp16/bf16 tolerance, with no call falling back;
- a prefill forward at N = 4096 with ``"tuner"`` is not slower than with ``"sdpa"`` on PyTorch's cuDNN
  backend, timed in the same run (warm-up, interleaved repeats, medians; 2% for the noise of one run);
- ``torch.compile(model)`` runs it, with no graph break inside the attention call;
- ``tuner.sdpa`` costs at most 25 us of host time per cached call, or no more than PyTorch's SDPA on the
  same tensors measured beside it where a busy host makes SDPA itself slower than that (the best of
  interleaved measurements of each), and reads transposed views in place.

Needs PyTorch with CUDA, transformers, CuPy and nvcc (the first call of each shape compiles its kernel).
"""

from __future__ import annotations

import statistics

import pytest

from .conftest import no_gpu_reason

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(no_gpu_reason() is not None, reason=str(no_gpu_reason()))]

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[test]')")

import tuner  # noqa: E402
from tuner.bench import host_us_per_call  # noqa: E402
from tuner.serve import ATTN_IMPLEMENTATION, reset_sdpa_fallbacks, sdpa_fallbacks  # noqa: E402

#: the largest difference allowed, relative to the largest magnitude of the reference output
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 3e-2}


def llama(attn: str, dtype, layers: int = 2):
    config = transformers.LlamaConfig(
        vocab_size=1024,
        hidden_size=4096,
        intermediate_size=4096,
        num_hidden_layers=layers,
        num_attention_heads=32,  # head dim 128
        num_key_value_heads=8,  # GQA: 4 query heads per K/V head
        max_position_embeddings=8192,
        attn_implementation=attn,
    )
    torch.manual_seed(0)
    return transformers.LlamaModel(config).to("cuda", dtype).eval()


def vit(attn: str, dtype):
    config = transformers.ViTConfig(
        image_size=224,
        patch_size=16,  # 197 tokens
        hidden_size=768,
        num_hidden_layers=2,
        num_attention_heads=12,  # head dim 64
        intermediate_size=1536,
        attn_implementation=attn,
    )
    torch.manual_seed(0)
    return transformers.ViTModel(config).to("cuda", dtype).eval()


@pytest.fixture(autouse=True)
def registered():
    assert tuner.register_transformers()
    reset_sdpa_fallbacks()
    yield
    reset_sdpa_fallbacks()


def _relative_error(ours, theirs) -> float:
    return ((ours.float() - theirs.float()).abs().max() / theirs.float().abs().max()).item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@torch.no_grad()
def test_llama_and_vit_outputs_match_sdpa(dtype):
    ids = torch.randint(0, 1024, (2, 512), device="cuda")
    ours = llama(ATTN_IMPLEMENTATION, dtype)(input_ids=ids).last_hidden_state
    theirs = llama("sdpa", dtype)(input_ids=ids).last_hidden_state
    assert _relative_error(ours, theirs) <= TOLERANCE[dtype]
    pixels = torch.randn(4, 3, 224, 224, device="cuda", dtype=dtype)
    ours = vit(ATTN_IMPLEMENTATION, dtype)(pixel_values=pixels).last_hidden_state
    theirs = vit("sdpa", dtype)(pixel_values=pixels).last_hidden_state
    assert _relative_error(ours, theirs) <= TOLERANCE[dtype]
    assert sdpa_fallbacks() == {}, "a call fell back to PyTorch: the kernels were not what ran"


def _forward_ms(model, ids) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    model(input_ids=ids)
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


@torch.no_grad()
def test_a_prefill_at_n4096_is_not_slower_than_sdpa_on_cudnn():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    ids = torch.randint(0, 1024, (1, 4096), device="cuda")
    models = {"tuner": llama(ATTN_IMPLEMENTATION, torch.bfloat16), "sdpa": llama("sdpa", torch.bfloat16)}
    times: dict[str, list[float]] = {name: [] for name in models}
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):  # the reference is cuDNN's kernel, nothing else
        for model in models.values():
            for _ in range(3):  # compile and load the kernels, warm the clocks
                _forward_ms(model, ids)
        for _ in range(15):  # interleaved: drifting clocks touch both alike
            for name, model in models.items():
                times[name].append(_forward_ms(model, ids))
    ours, theirs = statistics.median(times["tuner"]), statistics.median(times["sdpa"])
    print(f"prefill N=4096 bf16: tuner {ours:.3f} ms, sdpa (cuDNN) {theirs:.3f} ms")
    assert sdpa_fallbacks() == {}
    assert ours <= 1.02 * theirs, f"tuner {ours:.3f} ms vs sdpa (cuDNN) {theirs:.3f} ms per forward"


@torch.no_grad()
def test_torch_compile_runs_the_model_with_no_graph_break_in_attention():
    torch._dynamo.reset()
    model = llama(ATTN_IMPLEMENTATION, torch.float16)
    ids = torch.randint(0, 1024, (2, 1024), device="cuda")
    try:
        explained = torch._dynamo.explain(model)(input_ids=ids)
        in_attention = [
            r.reason[:300]
            for r in explained.break_reasons
            if any("/tuner/" in f.filename or "attention" in f.name for f in r.user_stack)
        ]
        assert not in_attention
        nodes = [n for g in explained.graphs for n in g.graph.nodes if "flashtune" in str(n.target)]
        others = sorted(
            {str(n.target) for g in explained.graphs for n in g.graph.nodes if "attention" in str(n.target)}
        )
        assert len(nodes) == 2, f"flashtune nodes {len(nodes)}, other attention nodes {others}"  # one per layer
        compiled = torch.compile(model)(input_ids=ids).last_hidden_state
        eager = model(input_ids=ids).last_hidden_state
        assert _relative_error(compiled, eager) <= TOLERANCE[torch.float16]
    finally:
        torch._dynamo.reset()


@torch.no_grad()
def test_sdpa_host_time_per_cached_call_and_no_copy():
    q, k, v = (torch.randn(1, 128, 4, 64, device="cuda", dtype=torch.float16).transpose(1, 2) for _ in range(3))
    out = tuner.sdpa(q, k, v, is_causal=True)  # the plan: compiled and loaded once
    assert out.transpose(1, 2).is_contiguous() and out.shape == q.shape
    torch.testing.assert_close(
        out, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), atol=2e-3, rtol=2e-3
    )
    # the best of 5 interleaved measurements of each (a host shared with other work only adds time; one run
    # on the device host has seen PyTorch's SDPA at 18 us, then 28 us a few seconds later)
    ours, theirs = [], []
    for _ in range(5):
        ours.append(host_us_per_call(lambda: tuner.sdpa(q, k, v, is_causal=True)))
        theirs.append(
            host_us_per_call(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
        )
    ours, theirs = min(ours), min(theirs)
    print(f"host time per call: tuner.sdpa {ours:.1f} us, F.scaled_dot_product_attention {theirs:.1f} us")
    assert sdpa_fallbacks() == {}
    assert ours <= max(25.0, theirs), f"tuner.sdpa {ours:.1f} us per cached call (PyTorch's SDPA {theirs:.1f} us)"
