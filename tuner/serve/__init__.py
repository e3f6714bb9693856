"""Calling a tuned kernel from Python: ``tuner.attention(q, k, v, causal=True, config=...)``.

:func:`attention` runs a flashtune forward kernel on PyTorch tensors or CuPy arrays, with the
family's default config, a dict of knobs, a header written by ``flashtune export``, or
``config="auto"``: the tuned config for each shape from a dispatch JSON, suite or storage
(:func:`load_tuned`, :class:`TunedConfigs`). Each (config, shapes, device) builds a launch plan
once; later calls only pack arguments and launch. With PyTorch it is also the operator
``torch.ops.flashtune.attention`` (:func:`register_torch_op`), which ``torch.compile`` traces.
:func:`sdpa` is ``F.scaled_dot_product_attention`` on the kernels (falling back to PyTorch for what they
cannot do), :func:`sdpa_patched` routes a model's SDPA calls through it, and
:func:`register_transformers` makes ``attn_implementation="tuner"`` run a transformers model on the kernels.
Importing this package needs no GPU, CuPy, PyTorch, transformers or Optuna.
"""

from ._api import attention, register_torch_op, resolve_config
from ._attention import AttentionError, AutoConfigWarning, clear_cache
from ._sdpa import FALLBACK_REASONS, SdpaFallbackWarning, reset_sdpa_fallbacks, sdpa, sdpa_fallbacks, sdpa_patched
from ._transformers import ATTN_IMPLEMENTATION, flashtune_attention_forward, register_transformers
from ._tuned import SHIPPED_DIR, TunedConfigs, TunedError, load_tuned, parse_tuned_json, shipped_tuned, tuned_configs

__all__ = [
    "ATTN_IMPLEMENTATION",
    "FALLBACK_REASONS",
    "SHIPPED_DIR",
    "AttentionError",
    "AutoConfigWarning",
    "SdpaFallbackWarning",
    "TunedConfigs",
    "TunedError",
    "attention",
    "clear_cache",
    "flashtune_attention_forward",
    "load_tuned",
    "parse_tuned_json",
    "register_torch_op",
    "register_transformers",
    "reset_sdpa_fallbacks",
    "resolve_config",
    "sdpa",
    "sdpa_fallbacks",
    "sdpa_patched",
    "shipped_tuned",
    "tuned_configs",
]
