"""``attn_implementation="tuner"`` (flashtune's kernels) in transformers, without a GPU and without downloads.

Small randomly initialised models are built from configs here: a Llama-style decoder with
grouped-query attention and a ViT-style encoder. On CPU tensors the registered function hands
every call to transformers' own SDPA path, so the outputs equal ``attn_implementation="sdpa"``
bit for bit; with the stand-in GPU (tests/fakes/standin_launch.py) the calls reach the kernel.
"""

from __future__ import annotations

import importlib
import inspect
import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[test]')")

import tuner  # noqa: E402
from tuner.serve import ATTN_IMPLEMENTATION, reset_sdpa_fallbacks, sdpa_fallbacks  # noqa: E402

sd = importlib.import_module("tuner.serve._sdpa")


def llama(attn: str, dtype=torch.float32):
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA: 2 query heads per K/V head
        max_position_embeddings=512,
        attn_implementation=attn,
    )
    torch.manual_seed(0)
    return transformers.LlamaModel(config).to(dtype).eval()


def vit(attn: str):
    config = transformers.ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,  # head dim 64
        intermediate_size=256,
        attn_implementation=attn,
    )
    torch.manual_seed(0)
    return transformers.ViTModel(config).eval()


@pytest.fixture(autouse=True)
def registered():
    assert tuner.register_transformers()
    reset_sdpa_fallbacks()
    yield
    reset_sdpa_fallbacks()


def test_the_name_is_registered_for_attention_and_masks():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.utils.generic import is_flash_attention_requested

    assert ATTN_IMPLEMENTATION == "tuner"  # no "flash" in it: transformers would import a FlashAttention build
    assert not is_flash_attention_requested(requested_attention_implementation=ATTN_IMPLEMENTATION)
    assert AttentionInterface._global_mapping["tuner"] is tuner.serve.flashtune_attention_forward
    assert (
        ALL_MASK_ATTENTION_FUNCTIONS._global_mapping["tuner"] is sys.modules["tuner.serve._transformers"].flashtune_mask
    )


@torch.no_grad()
def test_llama_decoder_on_cpu_equals_sdpa():
    ids = torch.randint(0, 128, (2, 24))
    padded = torch.ones(2, 24, dtype=torch.long)
    padded[1, :5] = 0  # left padding: a mask tensor
    for mask in (None, padded):
        ours = llama(ATTN_IMPLEMENTATION)(input_ids=ids, attention_mask=mask).last_hidden_state
        theirs = llama("sdpa")(input_ids=ids, attention_mask=mask).last_hidden_state
        assert torch.equal(ours, theirs)
    assert sdpa_fallbacks().get("cpu", 0) + sdpa_fallbacks().get("attn_mask", 0) == 4  # 2 layers x 2 runs
    assert set(sdpa_fallbacks()) <= {"cpu", "attn_mask"}


@torch.no_grad()
def test_vit_encoder_on_cpu_equals_sdpa():
    pixels = torch.randn(2, 3, 32, 32)
    ours = vit(ATTN_IMPLEMENTATION)(pixel_values=pixels).last_hidden_state
    theirs = vit("sdpa")(pixel_values=pixels).last_hidden_state
    assert torch.equal(ours, theirs) and sdpa_fallbacks() == {"cpu": 2}


@torch.no_grad()
def test_on_the_kernel_path_each_layer_launches_with_the_models_strides(monkeypatch):
    """Stand-in GPU: a causal, GQA prefill reaches the kernel once per layer, q/k/v read in place."""
    pytest.importorskip("cupy", reason="tuner.gpu needs CuPy installed (not a GPU)")
    from tests.fakes.standin_launch import StandInGPU, install

    gpu = StandInGPU()
    install(monkeypatch, gpu)
    monkeypatch.setattr(sd, "_cuda_device", lambda q, k, v: 0)
    monkeypatch.setattr(sd, "_device_arch", lambda index: 100)
    seen = []
    real = sd.run_checked

    def spy(torch_module, q, k, v, causal, *args):
        seen.append((q.data_ptr(), q.transpose(1, 2).stride()[:3], causal))
        return real(torch_module, q, k, v, causal, *args)

    monkeypatch.setattr("tuner.serve._transformers.run_checked", spy)
    model = llama(ATTN_IMPLEMENTATION, dtype=torch.float16)
    model(input_ids=torch.randint(0, 128, (2, 64)))
    assert sdpa_fallbacks() == {} and len(gpu.launches) == 2 == len(seen)
    for launch, (ptr, strides, causal) in zip(gpu.launches, seen):
        assert launch["args"][0] == ptr and launch["args"][10:13] == list(strides)
        assert causal is True and launch["args"][8:10] == [4, 2]  # causal; 4 query heads on 2 K/V heads
    tuner.serve.clear_cache()


@pytest.mark.parametrize(("build", "arch", "masks_built"), [("llama", 100, False), ("vit", 100, False),
                                                            ("llama", 90, True), ("vit", 90, True)])  # fmt: skip
def test_torch_compile_traces_a_model_with_no_graph_break_in_attention(monkeypatch, build, arch, masks_built):
    """CPU tensors count as CUDA ones and the operator's kernel call is a float32 reference: Dynamo traces
    the model, each layer's attention is one torch.ops.flashtune.attention node, and nothing breaks the graph.
    ``masks_built``: transformers as on PyTorch before 2.14, where it builds the causal mask while compiling
    (its export check reads true): the "tuner" mask function still gives none, so no call falls back."""
    import transformers.masking_utils as masking_utils

    import tuner.serve._torch_op as torch_op
    from tests.serve.test_torch_op import reference

    calls = []

    def run(*args):
        calls.append(args[3:])
        return reference(*args)

    monkeypatch.setattr(sd, "_cuda_device", lambda q, k, v: 0)
    monkeypatch.setitem(sd._arch, 0, arch)  # device 0 is an sm_<arch> GPU: the real (marked) lookup answers
    monkeypatch.setattr(torch_op, "_run", run)
    if masks_built:
        monkeypatch.setattr(masking_utils, "is_torchdynamo_exporting", lambda: True)
    tuner.serve.register_torch_op()
    torch._dynamo.reset()
    if build == "llama":
        model, inputs = llama(ATTN_IMPLEMENTATION, dtype=torch.float16), {"input_ids": torch.randint(0, 128, (2, 64))}
        same = llama("sdpa", dtype=torch.float16)  # the same weights (same seed) on PyTorch's SDPA
    else:
        model, inputs = vit(ATTN_IMPLEMENTATION).half(), {"pixel_values": torch.randn(2, 3, 32, 32).half()}
        same = vit("sdpa").half()
    try:
        with torch.no_grad():
            explained = torch._dynamo.explain(model)(**inputs)
            assert explained.graph_break_count == 0, [r.reason[:300] for r in explained.break_reasons]
            nodes = [n for g in explained.graphs for n in g.graph.nodes if "flashtune" in str(n.target)]
            assert len(nodes) == 2  # one per layer
            compiled = torch.compile(model, backend="aot_eager")(**inputs).last_hidden_state
            eager = same(**inputs).last_hidden_state
        torch.testing.assert_close(compiled, eager, atol=2e-2, rtol=2e-2)  # fp16 weights, a float32 reference
        assert sdpa_fallbacks() == {} and calls
    finally:
        torch._dynamo.reset()


def test_the_mask_function_gives_no_mask_only_where_is_causal_says_it_all():
    """flashtune_mask against transformers' sdpa_mask: None for the plain causal mask over as many keys as
    queries and for the plain full mask, both without padding; the very mask of sdpa_mask otherwise."""
    import transformers.masking_utils as mu

    from tuner.serve._transformers import flashtune_mask

    params = inspect.signature(mu.sdpa_mask).parameters

    def call(q_length, kv_length, **kw):
        args = {"batch_size": 2, "kv_length": kv_length, **kw}
        if "q_length" in params:
            args["q_length"] = q_length
        else:
            args["cache_position"] = torch.arange(kv_length - q_length, kv_length)
        return flashtune_mask(**args), mu.sdpa_mask(**args)

    assert call(64, 64)[0] is None
    assert call(64, 64, mask_function=mu.bidirectional_mask_function, allow_is_bidirectional_skip=True)[0] is None
    padding = torch.ones(2, 64, dtype=torch.bool)
    padding[1, :5] = False
    for case in (
        {"attention_mask": padding},
        {"local_size": 16},
        {"allow_is_causal_skip": False},
        {
            "mask_function": mu.and_masks(mu.causal_mask_function, mu.causal_mask_function),
            "allow_is_causal_skip": False,
        },
    ):
        ours, theirs = call(64, 64, **case)
        assert ours is not None and torch.equal(ours, theirs), case
    ours, theirs = call(16, 64, allow_is_causal_skip=False)  # queries after 48 cached keys: not the plain mask
    assert ours is not None and torch.equal(ours, theirs)
    ours, theirs = call(16, 64)  # and where transformers decides itself, its decision
    assert (ours is None) == (theirs is None) and (ours is None or torch.equal(ours, theirs))


def test_the_mask_function_reads_the_signature_once_and_binds_as_inspect_does(monkeypatch):
    """flashtune_mask runs once per model forward: it reads sdpa_mask's parameters once (``inspect.signature``
    costs about 20 us a call), and names a call's arguments as ``Signature.bind`` with its defaults does."""
    import transformers.masking_utils as mu

    tx = importlib.import_module("tuner.serve._transformers")

    def f(a, b, c=3, *, d, e=5, **rest):
        return None

    bound = inspect.signature(f)
    for args, kwargs in (((1, 2), {"d": 4}), ((1,), {"b": 2, "d": 4, "e": 6}), ((1, 2, 7), {"d": 4, "x": 8})):
        expected = bound.bind(*args, **kwargs)
        expected.apply_defaults()
        want = {k: v for k, v in expected.arguments.items() if k != "rest"} | expected.arguments["rest"]
        assert tx._arguments(f, args, kwargs) == want
    for args, kwargs in (((1,), {"d": 4}), ((1, 2), {}), ((1, 2, 3, 4), {"d": 4}), ((1, 2), {"a": 1, "d": 4})):
        with pytest.raises(TypeError):
            bound.bind(*args, **kwargs)
        assert tx._arguments(f, args, kwargs) is None  # then flashtune_mask calls sdpa_mask, which raises

    def g(a, /, b, c=3, *, d=4):  # no **: an unknown keyword does not fit; a positional-only one never by name
        return None

    assert tx._arguments(g, (1, 2), {"d": 5}) == {"a": 1, "b": 2, "c": 3, "d": 5}
    for args, kwargs in (((1, 2), {"x": 0}), ((), {"a": 1, "b": 2})):
        with pytest.raises(TypeError):
            inspect.signature(g).bind(*args, **kwargs)
        assert tx._arguments(g, args, kwargs) is None

    tuner.register_transformers()
    call = {"batch_size": 1, "kv_length": 64, "mask_function": mu.causal_mask_function}
    if "q_length" in inspect.signature(mu.sdpa_mask).parameters:
        call["q_length"] = 64
    else:
        call["cache_position"] = torch.arange(64)
    assert tx.flashtune_mask(**call) is None

    def no_signature(*args, **kwargs):
        raise AssertionError("inspect.signature called again")

    monkeypatch.setattr(tx.inspect, "signature", no_signature)
    assert tx.flashtune_mask(**call) is None
    padding = torch.ones(1, 64, dtype=torch.bool)
    padding[0, :5] = False
    assert torch.equal(tx.flashtune_mask(**call, attention_mask=padding), mu.sdpa_mask(**call, attention_mask=padding))
