"""``import flashtune``: the distribution's name as an import name for the :mod:`tuner` package.

The code lives in ``tuner/`` (README, "How it works"); this module re-exports its public API
(``tuner.__all__``: ``flashtune.attention``, ``flashtune.sdpa``, ...) and makes every module under it
reachable by the other name too: ``import flashtune.serve`` or ``flashtune.study`` is the same module
object as :mod:`tuner.serve` or :mod:`tuner.study`, never a second copy (a second copy would register
the torch operator twice and keep a second plan cache).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

import tuner
from tuner import *  # noqa: F403  (the public API, as tuner.__all__ lists it)
from tuner import __all__, __version__  # noqa: F401


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``flashtune.X.Y`` as the module ``tuner.X.Y`` (imported once, under its own name)."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(__name__ + "."):
            return None
        real = "tuner" + fullname[len(__name__) :]
        if importlib.util.find_spec(real) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return importlib.import_module("tuner" + spec.name[len(__name__) :])

    def exec_module(self, module):
        """Nothing to run: the module was executed once, as part of ``tuner``."""


def __getattr__(name: str):
    """``flashtune.study`` and the like: the subpackage of ``tuner`` of that name."""
    if not name.startswith("_") and importlib.util.find_spec(f"tuner.{name}") is not None:
        return importlib.import_module(f"tuner.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if not any(isinstance(f, _Alias) for f in sys.meta_path):
    sys.meta_path.append(_Alias())
del tuner
