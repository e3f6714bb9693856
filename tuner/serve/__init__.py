"""Calling a tuned kernel from Python: ``tuner.attention(q, k, v, causal=True, config=...)``.

:func:`attention` runs a flashtune forward kernel on PyTorch tensors or CuPy arrays, with the
family's default config, a dict of knobs, a header written by ``flashtune export``, or
``config="auto"``: the tuned config for each shape from a dispatch JSON, suite or storage
(:func:`load_tuned`, :class:`TunedConfigs`). Each (config, shapes, device) builds a launch plan
once; later calls only pack arguments and launch. With PyTorch it is also the operator
``torch.ops.flashtune.attention`` (:func:`register_torch_op`), which ``torch.compile`` traces.
Importing this package needs no GPU, CuPy, PyTorch or Optuna.
"""

from ._api import attention, register_torch_op, resolve_config
from ._attention import AttentionError, AutoConfigWarning, clear_cache
from ._tuned import SHIPPED_DIR, TunedConfigs, TunedError, load_tuned, parse_tuned_json, shipped_tuned, tuned_configs

__all__ = [
    "SHIPPED_DIR",
    "AttentionError",
    "AutoConfigWarning",
    "TunedConfigs",
    "TunedError",
    "attention",
    "clear_cache",
    "load_tuned",
    "parse_tuned_json",
    "register_torch_op",
    "resolve_config",
    "shipped_tuned",
    "tuned_configs",
]
