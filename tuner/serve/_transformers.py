"""``attn_implementation="tuner"`` in Hugging Face transformers: a model's attention on flashtune kernels.

The name is ``"tuner"`` (the import name), not ``"flashtune"``: transformers treats every
``attn_implementation`` that contains ``"flash"`` as a FlashAttention build and tries to import
it (``is_flash_attention_requested``, transformers 4.5x-5.x), so ``"flashtune"`` cannot be one.

:func:`register_transformers` registers :func:`flashtune_attention_forward` with
``transformers.AttentionInterface`` under :data:`ATTN_IMPLEMENTATION`, and transformers' SDPA mask function
under the same name with ``AttentionMaskInterface``, wrapped (:func:`flashtune_mask`): a model builds the
masks it builds for ``"sdpa"``, and none where the mask is the plain causal or full one with no padding, also
while ``torch.compile`` traces (transformers builds it there on PyTorch before 2.14, and a mask sends the call
to PyTorch's SDPA). The function does what transformers' own
``sdpa_attention_forward`` does to decide ``is_causal`` and grouped-query attention, and runs
:func:`tuner.sdpa`'s kernel path (its checks made once); a call they cannot run (a padding mask, dropout,
CPU tensors, training, ``softcap``, ``position_bias``: :data:`tuner.serve.FALLBACK_REASONS`) is handed to
``sdpa_attention_forward`` itself, unchanged, so its result is exactly that of ``"sdpa"``.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from ..space import AUTO_FAMILY
from ._sdpa import _torch, count_fallback, kernel_refusal, run_checked

__all__ = ["ATTN_IMPLEMENTATION", "flashtune_attention_forward", "flashtune_mask", "register_transformers"]

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
    sdpa_attention_forward = _transformers["sdpa_attention_forward"]  # no import here: it would break the graph
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
    tracing = torch.compiler.is_compiling()
    reason = reason or kernel_refusal(
        torch, query, k, v, attention_mask, dropout, causal, groups > 1 or query.shape[1] != k.shape[1], AUTO_FAMILY,
        tracing,
    )  # fmt: skip
    if reason is not None:
        count_fallback(reason, torch)
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    out = run_checked(torch, query, k, v, causal, scaling, tracing)
    return out.transpose(1, 2), None


def flashtune_mask(*args: Any, **kwargs: Any):
    """transformers' ``sdpa_mask`` for ``"tuner"``, but None (no mask: the kernels' own causal or full
    attention) where the mask would only say what ``is_causal`` says: no padding mask, the unmodified causal
    mask over as many keys as queries (offsets 0) or the unmodified full one, and skipping allowed.

    transformers skips those masks itself, except while ``torch.compile`` traces on PyTorch before 2.14
    (its export check reads true there): then every call would carry a mask and go to PyTorch's SDPA.
    The rule needs no tensor's values (only Python ints, None and shapes), so it holds under tracing.
    With the kernels' bottom-right causal alignment, what ``torch.export`` fixes at a traced shape stays right.
    """
    masking_utils = _transformers["masking_utils"]  # no import here: it would break the graph
    sdpa_mask = masking_utils.sdpa_mask
    a = _arguments(sdpa_mask, args, kwargs)
    if a is None:
        return sdpa_mask(*args, **kwargs)
    if a.get("attention_mask") is not None or a.get("local_size") is not None:
        return sdpa_mask(*args, **kwargs)
    offsets_zero = all(isinstance(a.get(o, 0), int) and a.get(o, 0) == 0 for o in ("q_offset", "kv_offset"))
    function = a.get("mask_function")
    if function is getattr(masking_utils, "causal_mask_function", None) and a.get("allow_is_causal_skip"):
        q_length = a["q_length"] if "q_length" in a else getattr(a.get("cache_position"), "shape", (None,))[0]
        if offsets_zero and q_length is not None and q_length == a.get("kv_length"):
            return None
    bidirectional = function is getattr(masking_utils, "bidirectional_mask_function", None)
    if bidirectional and offsets_zero and a.get("allow_is_bidirectional_skip", a.get("allow_is_causal_skip")):
        return None
    return sdpa_mask(*args, **kwargs)


#: what the functions above use of transformers, imported by register_transformers (inside torch.compile's
#: tracing, an import from transformers' lazy modules breaks the graph)
_transformers: dict[str, Any] = {}


def _arguments(function, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """``function``'s arguments of a call by name, defaults filled in, as ``inspect.Signature.bind`` and
    ``apply_defaults`` give them (but extra keyword arguments at the top level, not under the ``**`` parameter's
    name); None where the call does not fit the signature, or uses ``*args`` or a positional-only parameter by
    keyword (``function`` is then called as given: it raises its own error, or binds what this does not).

    The parameters are read once per function. A mask is built in every model forward, on a host that a prefill
    keeps busy: ``inspect.signature`` and ``bind`` cost about 27 us a call there, a cached signature's ``bind``
    and ``apply_defaults`` 13 us, this 2 us."""
    cached = _signatures.get(function)
    if cached is None:
        parameters = inspect.signature(function).parameters.values()
        positional = tuple(p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
        required = frozenset(
            p.name for p in parameters if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        )
        defaults = {p.name: p.default for p in parameters if p.default is not p.empty}
        # names a keyword may take: None where **kwargs takes any other than the positional-only ones
        by_name = frozenset(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        any_keyword = any(p.kind == p.VAR_KEYWORD for p in parameters)
        positional_only = frozenset(p.name for p in parameters if p.kind == p.POSITIONAL_ONLY)
        cached = _signatures[function] = (
            positional,
            required,
            defaults,
            None if any_keyword else by_name,
            positional_only,
        )
    positional, required, defaults, by_name, positional_only = cached
    if len(args) > len(positional) or any(name in kwargs for name in positional[: len(args)]):
        return None
    if positional_only & kwargs.keys() or (by_name is not None and not kwargs.keys() <= by_name):
        return None
    given = {**dict(zip(positional, args)), **kwargs}
    if not required <= given.keys():
        return None
    return {**defaults, **given}


#: per function :func:`_arguments` has read: its positional parameter names, the required ones, the defaults, the
#: names a keyword may take (None: any, through ``**``) and the positional-only names
_signatures: dict[Any, tuple] = {}


@functools.cache
def register_transformers() -> bool:
    """Register ``attn_implementation="tuner"`` (once; later calls only answer). False where transformers
    has no ``AttentionInterface`` (before 4.48)."""
    try:
        from transformers import AttentionInterface, masking_utils
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # noqa: F401 (present)
    except ImportError:
        return False
    _transformers.update(sdpa_attention_forward=sdpa_attention_forward, masking_utils=masking_utils)
    _torch()  # marks the host lookups for torch.compile before any model is traced
    AttentionInterface.register(ATTN_IMPLEMENTATION, flashtune_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, flashtune_mask)
    return True
