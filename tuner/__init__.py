"""flashtune: autotune FlashAttention forward kernels.

The data flow, top to bottom: a space file (:mod:`tuner.space`) declares the knobs; a search
(:mod:`tuner.search`) proposes configs; :mod:`tuner.compile` builds cubins on CPU processes; a GPU
worker process (:mod:`tuner.run`) runs a :class:`tuner.gpu.GpuHandler` that checks and times them;
:mod:`tuner.study` stores trials in an Optuna database; :mod:`tuner.run` re-times the best and stores
the winner; :mod:`tuner.export`, :mod:`tuner.serve` and :mod:`tuner.report` turn studies into headers,
calls and pages.
"""

import sys

from ._version import __version__
from .devices import DeviceLimits, limits_for_arch
from .errors import FlashtuneError
from .problem import Problem
from .serve import attention, register_transformers, sdpa, sdpa_fallbacks, sdpa_patched
from .space import Space, load_space

__all__ = [
    "DeviceLimits",
    "FlashtuneError",
    "Problem",
    "Space",
    "__version__",
    "attention",
    "limits_for_arch",
    "load_space",
    "register_transformers",
    "sdpa",
    "sdpa_fallbacks",
    "sdpa_patched",
]

if "torch" in sys.modules:  # PyTorch is loaded already: register torch.ops.flashtune.attention (tuner.torch_op)
    from .serve import register_torch_op

    register_torch_op()

if "transformers" in sys.modules:  # transformers is loaded already: register attn_implementation="tuner"
    register_transformers()
