"""A Hugging Face model's attention shapes as a suite: ``flashtune tune --model config.json``.

From a model's ``config.json`` (as ``transformers`` saves it; nothing is downloaded) this reads what
the attention kernels see: ``num_attention_heads``, ``num_key_value_heads`` (GQA; default: the heads),
``head_dim`` (else ``hidden_size / num_attention_heads``) and ``torch_dtype`` / ``dtype``. A composite
model's parts (``text_config``, ``vision_config``, ... : any sub-table that has attention heads) are each
read the same way, a missing dtype inherited from the top. Whether a part's attention is causal: a
decoder's is (``is_decoder``, an architecture ``...ForCausalLM`` / ``...LMHeadModel``, or the text part
of a composite model), an encoder's or a vision part's is not. The sequence lengths and batch are the
caller's (they are not in a config); :func:`model_suite_text` writes the problems as a suite file,
which ``tune --suite``, ``export --dispatch --suite`` and ``config="auto", tuned=`` read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import FlashtuneError
from ..problem import Problem, ProblemError
from ..text import printable

__all__ = ["ModelError", "ModelShapes", "model_shapes", "model_suite_text"]

#: the largest config.json read (real ones are a few KiB)
MAX_CONFIG_BYTES = 1 << 20
_DTYPES = {"float16": "fp16", "fp16": "fp16", "half": "fp16", "bfloat16": "bf16", "bf16": "bf16"}
_CAUSAL_ARCH = re.compile(r"(ForCausalLM|LMHeadModel)$")


class ModelError(FlashtuneError, ValueError):
    """A model config that names no attention shape flashtune can read."""


@dataclass(frozen=True)
class ModelShapes:
    """What a config says of its attention: one entry per part (``""``: the model itself)."""

    name: str
    problems: tuple[Problem, ...]
    parts: tuple[str, ...]


def _load(path: str | Path) -> dict[str, Any]:
    from ..files import FileContentError, read_limited

    shown = printable(path, 200)
    try:
        _, data = read_limited(str(path), MAX_CONFIG_BYTES)
        config = json.loads(data.decode("utf-8"))
    except FileContentError as e:
        raise ModelError(f"--model: {e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"--model {shown}: not a JSON model config ({e}); give a model's config.json") from None
    if not isinstance(config, dict):
        raise ModelError(f"--model {shown}: a model config is a JSON object, this is a {type(config).__name__}")
    return config


def _int(part: Mapping[str, Any], key: str, where: str) -> int | None:
    value = part.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelError(f"{where}: {key} must be a positive integer, not {printable(value, 40)!r}")
    return value


def _dtype(part: Mapping[str, Any], inherited: str | None, override: str | None, where: str) -> str:
    if override is not None:
        return override
    text = part.get("torch_dtype") or part.get("dtype") or inherited  # null in a part: the model's
    if text is None:
        raise ModelError(f"{where}: names no torch_dtype or dtype; pass --dtype fp16 or bf16")
    dtype = _DTYPES.get(str(text).removeprefix("torch."))
    if dtype is None:
        raise ModelError(
            f"{where}: dtype {printable(text, 40)!r}; the kernels run float16 or bfloat16: pass --dtype fp16 or bf16"
        )
    return dtype


def _is_causal(part: Mapping[str, Any], top: Mapping[str, Any], key: str) -> bool:
    if part.get("is_decoder") is True:
        return True
    if key:  # a part of a composite model: its text model decodes, its vision or audio encoder does not
        return key == "text_config"
    archs = part.get("architectures") or []
    return any(isinstance(a, str) and _CAUSAL_ARCH.search(a) for a in archs) and not top.get("is_encoder_decoder")


_HEADS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
_KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_head_kv")
_HEAD_DIM = ("head_dim", "d_kv", "kv_channels")
_HIDDEN = ("hidden_size", "n_embd", "d_model", "dim")


def _first(part: Mapping[str, Any], keys: Sequence[str], where: str) -> int | None:
    for key in keys:
        value = _int(part, key, where)
        if value is not None:
            return value
    return None


def _head_dim(part: Mapping[str, Any], heads: int, where: str) -> int:
    head_dim = _first(part, _HEAD_DIM, where)
    if head_dim is not None:
        return head_dim
    hidden = _first(part, _HIDDEN, where)
    if hidden is None:
        raise ModelError(
            f"{where}: names neither head_dim nor hidden_size; not a transformer config flashtune can read"
        )
    if hidden % heads:
        raise ModelError(f"{where}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    return hidden // heads


def _parts(config: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(key, table) of each part with attention heads: the config itself, else its ``*_config`` tables."""
    if any(k in config for k in _HEADS):
        return [("", config)]
    return [
        (k, v)
        for k, v in config.items()
        if k.endswith("_config") and isinstance(v, dict) and any(h in v for h in _HEADS)
    ]


def model_shapes(
    path: str | Path,
    *,
    seqlens: Sequence[int],
    batch: int,
    dtype: str | None = None,
    causal: bool | None = None,
) -> ModelShapes:
    """The attention problems of the model ``path`` describes at each of ``seqlens`` (``dtype``/``causal``:
    what the caller gives instead of the config's); :class:`ModelError` in one line where it cannot tell."""
    config = _load(path)
    shown = printable(path, 200)
    parts = _parts(config)
    if not parts:
        nested = sorted(k for k, v in config.items() if isinstance(v, dict))
        raise ModelError(
            f"--model {shown}: names no attention heads (num_attention_heads) at its top"
            + (f" nor in {', '.join(nested)}" if nested else "")
            + "; give the config.json of a transformer model"
        )
    top_dtype = config.get("torch_dtype") or config.get("dtype")
    problems: list[Problem] = []
    for key, part in parts:
        where = f"--model {shown}" + (f" {key}" if key else "")
        heads = _first(part, _HEADS, where)
        kv_heads = _first(part, _KV_HEADS, where) or heads
        head_dim = _head_dim(part, heads, where)
        part_dtype = _dtype(part, top_dtype, dtype, where)
        is_causal = causal if causal else _is_causal(part, config, key)
        for seqlen in seqlens:
            try:
                problems.append(
                    Problem(
                        batch=batch,
                        seqlen_q=seqlen,
                        heads_q=heads,
                        heads_kv=kv_heads,
                        head_dim=head_dim,
                        dtype=part_dtype,
                        causal=is_causal,
                    )
                )
            except ProblemError as e:
                raise ModelError(f"{where}: {e}") from None
    name = str(config.get("_name_or_path") or config.get("model_type") or Path(path).resolve().parent.name or "model")
    return ModelShapes(name=name, problems=tuple(dict.fromkeys(problems)), parts=tuple(k or "model" for k, _ in parts))


def _toml_string(text: str) -> str:
    return json.dumps(text)  # a JSON string is a TOML basic string (escapes included)


def model_suite_text(family: str, shapes: ModelShapes, source: str, storage: str | None = None) -> str:
    """A suite file (:mod:`tuner.study._suite`'s format) holding the model's problems."""
    lines = [
        f"# The attention of {printable(shapes.name, 200)} ({', '.join(shapes.parts)}), from {printable(source, 200)}",
        "# by `flashtune tune --model`; tune it again with `flashtune tune --suite THIS_FILE`, export it with",
        "# `flashtune export --dispatch --suite THIS_FILE -o dispatch.h` (dispatch.json: tuned= of tuner.attention)",
        f"description = {_toml_string('attention of ' + printable(shapes.name, 200))}",
        f"family = {_toml_string(family)}",
    ]
    if storage:
        lines.append(f"storage = {_toml_string(storage)}")
    for p in shapes.problems:
        lines += [
            "",
            "[[problems]]",
            f'dtype = "{p.dtype}"',
            f"head_dim = {p.head_dim}",
            f"causal = {'true' if p.causal else 'false'}",
            f"batch = {p.batch}",
            f"seqlen = {p.seqlen_q}",
            f"heads = {p.heads_q}",
            f"kv_heads = {p.heads_kv}",
        ]
    return "\n".join(lines) + "\n"
