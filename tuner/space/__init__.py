"""Knob spaces: a kernel family's knobs, derived values and constraints, read from its space file.

``load_space("sm90")`` reads ``search_spaces/sm90.toml`` (format: ``search_spaces/README.md``),
checks it thoroughly and returns a :class:`Space`. Everything else is computed from that one
object: the search's distributions (:class:`Knob`), the static feasibility check that runs before
any compile (``Space.check``), the ``-D`` macros of a build (``Space.build_macros``) and of an
exported header (``Space.macros``), the launch geometry (``Space.launch``) and a partial config made
whole (:func:`complete`: the defaults, or the feasible values nearest them). Derived values,
constraints and launch sizes are small integer expressions (:func:`compile_expr`), which refuse
anything but arithmetic, comparisons, conditionals and a few whitelisted functions.
:func:`choose_family` is ``family="auto"``: the most specialised family that runs on a device.
"""

from __future__ import annotations

from ._choose import AUTO_FAMILY, choose_family, family_preference, rank_families
from ._complete import complete, conflicts
from ._expr import Expr, ExprError, compile_expr
from ._space import (
    KERNELS_ENV,
    Completion,
    Config,
    ConfigError,
    Constraint,
    Derived,
    Family,
    Knob,
    LaunchGeometry,
    Space,
    SpaceError,
    available_families,
    config_key,
    kernel_dirs,
    load_space,
)

__all__ = [
    "AUTO_FAMILY",
    "KERNELS_ENV",
    "Completion",
    "Config",
    "ConfigError",
    "Constraint",
    "Derived",
    "Expr",
    "ExprError",
    "Family",
    "Knob",
    "LaunchGeometry",
    "Space",
    "SpaceError",
    "available_families",
    "choose_family",
    "compile_expr",
    "complete",
    "config_key",
    "conflicts",
    "family_preference",
    "kernel_dirs",
    "load_space",
    "rank_families",
]
