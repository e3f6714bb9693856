"""tuner.study.model_shapes: a Hugging Face config.json's attention shapes, for the config classes
transformers saves (decoders with GQA, encoders, GPT-2 names, T5 names, composite models)."""

from __future__ import annotations

import json

import pytest

from tuner.problem import Problem
from tuner.study import ModelError, load_suite, model_shapes, model_suite_text

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
}
VIT = {"architectures": ["ViTModel"], "model_type": "vit", "hidden_size": 768, "num_attention_heads": 12}


def write(tmp_path, config, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (LLAMA, dict(heads_q=32, heads_kv=8, head_dim=128, dtype="bf16", causal=True)),
        ({**LLAMA, "head_dim": 64, "num_key_value_heads": None}, dict(heads_q=32, heads_kv=32, head_dim=64)),
        ({**VIT, "torch_dtype": "float16"}, dict(heads_q=12, heads_kv=12, head_dim=64, dtype="fp16", causal=False)),
        (
            {"architectures": ["GPT2LMHeadModel"], "n_embd": 768, "n_head": 12, "torch_dtype": "float16"},
            dict(heads_q=12, head_dim=64, causal=True),
        ),
        (
            {"architectures": ["BertModel"], "hidden_size": 1024, "num_attention_heads": 16, "dtype": "bfloat16"},
            dict(head_dim=64, dtype="bf16", causal=False),
        ),
        ({**LLAMA, "is_decoder": True, "architectures": []}, dict(causal=True)),
    ],
)
def test_the_attention_shape_of_a_config(tmp_path, config, expected):
    shapes = model_shapes(write(tmp_path, config), seqlens=(1024, 4096), batch=2)
    assert [p.seqlen_q for p in shapes.problems] == [1024, 4096]
    for p in shapes.problems:
        assert p.batch == 2 and p.seqlen_k == p.seqlen_q
        assert {k: getattr(p, k) for k in expected} == expected


def test_flags_override_the_config_dtype_and_mask(tmp_path):
    shapes = model_shapes(write(tmp_path, VIT), seqlens=(197,), batch=8, dtype="bf16", causal=True)
    assert shapes.problems == (Problem(batch=8, seqlen_q=197, heads_q=12, head_dim=64, dtype="bf16", causal=True),)


def test_a_composite_model_tunes_each_part_with_attention(tmp_path):
    config = {
        "architectures": ["LlavaForConditionalGeneration"],
        "torch_dtype": "float16",
        "text_config": {**LLAMA, "torch_dtype": None},
        "vision_config": {"hidden_size": 1024, "num_attention_heads": 16, "image_size": 336},
        "projector_config": {"hidden_size": 10},
    }
    shapes = model_shapes(write(tmp_path, config), seqlens=(2048,), batch=1)
    assert shapes.parts == ("text_config", "vision_config")
    text, vision = shapes.problems
    assert (text.heads_q, text.heads_kv, text.head_dim, text.causal, text.dtype) == (32, 8, 128, True, "fp16")
    assert (vision.heads_q, vision.head_dim, vision.causal, vision.dtype) == (16, 64, False, "fp16")


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{not json", "not a JSON model config"),
        ("[1, 2]", "a model config is a JSON object"),
        (json.dumps({"model_type": "x", "text_config": {"vocab_size": 3}}), "names no attention heads"),
        (json.dumps({**LLAMA, "torch_dtype": "float32"}), "pass --dtype fp16 or bf16"),
        (json.dumps({**LLAMA, "torch_dtype": None}), "names no torch_dtype or dtype"),
        (json.dumps({**LLAMA, "hidden_size": 4095}), "not a multiple of num_attention_heads"),
        (json.dumps({**LLAMA, "num_key_value_heads": 5}), "heads"),
        (json.dumps({**LLAMA, "num_attention_heads": "32"}), "must be a positive integer"),
        (json.dumps({"num_attention_heads": 8, "torch_dtype": "float16"}), "neither head_dim nor hidden_size"),
    ],
)
def test_a_config_it_cannot_read_is_refused_in_one_line(tmp_path, content, fragment):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(ModelError, match=fragment) as caught:
        model_shapes(path, seqlens=(1024,), batch=1)
    assert "\n" not in str(caught.value) and "config.json" in str(caught.value)


def test_a_missing_or_huge_config_is_refused(tmp_path):
    with pytest.raises(ModelError, match="cannot read"):
        model_shapes(tmp_path / "absent.json", seqlens=(1,), batch=1)
    (tmp_path / "big.json").write_text(" " * (2 << 20))
    with pytest.raises(ModelError, match="more than"):
        model_shapes(tmp_path / "big.json", seqlens=(1,), batch=1)


def test_the_suite_text_reads_back_as_the_same_problems(tmp_path):
    shapes = model_shapes(write(tmp_path, {**LLAMA, "_name_or_path": 'meta/"odd" name'}), seqlens=(512, 8192), batch=4)
    path = tmp_path / "m.toml"
    path.write_text(model_suite_text("sm80", shapes, "config.json", "sqlite:///x.db"))
    suite = load_suite(path)
    assert suite.problems == shapes.problems and suite.family == "sm80" and suite.storage == "sqlite:///x.db"
