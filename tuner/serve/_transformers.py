"""``attn_implementation="tuner"`` in Hugging Face transformers: a model's attention on flashtune kernels.

The name is ``"tuner"`` (the import name), not ``"flashtune"``: transformers treats every
``attn_implementation`` that contains ``"flash"`` as a FlashAttention build and tries to import
it (``is_flash_attention_requested``, transformers 4.5x-5.x), so ``"flashtune"`` cannot be one.

:func:`register_transformers` registers :func:`flashtune_attention_forward` with
``transformers.AttentionInterface`` under :data:`ATTN_IMPLEMENTATION`, and transformers' SDPA mask function
under the same name with ``AttentionMaskInterface`` (so a model builds the masks it builds for
``"sdpa"``: none where ``is_causal`` covers it). The function does what transformers' own
``sdpa_attention_forward`` does to decide ``is_causal`` and grouped-query attention, and runs
:func:`tuner.sdpa` on the kernels; a call they cannot run (a padding mask, dropout, CPU tensors,
training, ``softcap``, ``position_bias``: :data:`tuner.serve.FALLBACK_REASONS`) is handed to
``sdpa_attention_forward`` itself, unchanged, so its result is exactly that of ``"sdpa"``.
"""

from __future__ import annotations

import functools
from typing import Any

from ..space import AUTO_FAMILY
from ._sdpa import _torch, count_fallback, kernel_refusal, sdpa

__all__ = ["ATTN_IMPLEMENTATION", "flashtune_attention_forward", "register_transformers"]

#: the ``attn_implementation`` name a model selects flashtune's kernels with (no "flash" in it: see above)
ATTN_IMPLEMENTATION = "tuner"


def flashtune_attention_forward(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
):
    """A transformers attention function: ``query`` ``[B, H, N, D]``, ``key``/``value`` ``[B, H_kv, N_k, D]``;
    returns (``[B, N, H, D]`` attention output, None), as ``sdpa_attention_forward`` does."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch = _torch()
    groups = getattr(module, "num_key_value_groups", 1)
    q_length = query.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(q_length > 1 and attention_mask is None and causal)
    k, v = key, value
    if causal and k.shape[2] > q_length:  # transformers' crop of an empty static cache at prefill
        k, v = k[:, :, :q_length], v[:, :, :q_length]
    reason = (
        "transformers_option" if kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None else None
    )
    reason = reason or kernel_refusal(
        torch, query, k, v, attention_mask, dropout, causal, groups > 1 or query.shape[1] != k.shape[1], AUTO_FAMILY
    )
    if reason is not None:
        count_fallback(reason, torch)
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    out = sdpa(query, k, v, None, 0.0, causal, scaling, query.shape[1] != k.shape[1])
    return out.transpose(1, 2), None


@functools.cache
def register_transformers() -> bool:
    """Register ``attn_implementation="tuner"`` (once; later calls only answer). False where transformers
    has no ``AttentionInterface`` (before 4.48)."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:
        return False
    AttentionInterface.register(ATTN_IMPLEMENTATION, flashtune_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
    return True
