"""TODO tuner.serve."""

from ._attention import AttentionError, attention, register_torch_op, resolve_config
from ._tuned import DispatchTable, JSON_FORMAT, TunedConfigs, TunedError, load_tuned, parse_tuned_json, tuned_configs

__all__ = ['AttentionError', 'DispatchTable', 'JSON_FORMAT', 'TunedConfigs', 'TunedError', 'attention', 'load_tuned', 'parse_tuned_json', 'register_torch_op', 'resolve_config', 'tuned_configs']
