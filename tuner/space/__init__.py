"""TODO tuner.space."""

from ._expr import ExprError, compile_expr
from ._space import Config, ConfigError, Knob, Space, SpaceError, available_families, config_key, load_space

__all__ = ['Config', 'ConfigError', 'ExprError', 'Knob', 'Space', 'SpaceError', 'available_families', 'compile_expr', 'config_key', 'load_space']
