"""flashtune: autotune FlashAttention forward kernels.

The data flow, top to bottom: a space file (:mod:`tuner.space`) declares the knobs; a sampler
(:mod:`tuner.search`) proposes configs; :mod:`tuner.compile` builds cubins on CPU processes;
a GPU worker (:mod:`tuner.worker`, :mod:`tuner.gpu`) checks and times them; :mod:`tuner.study`
stores trials in an Optuna database; :mod:`tuner.retime` picks the winner.
"""

import sys

from ._version import __version__

from .serve import attention  # noqa: E402  (GPU modules are imported on the first call)
from .devices import DeviceLimits, limits_for_arch  # noqa: E402
from .errors import FlashtuneError  # noqa: E402
from .problem import Problem  # noqa: E402
from .space import Space, load_space  # noqa: E402

__all__ = ["DeviceLimits", "FlashtuneError", "Problem", "Space", "__version__", "attention", "limits_for_arch",
           "load_space"]

if "torch" in sys.modules:  # PyTorch is loaded already: register torch.ops.flashtune.attention (tuner.torch_op)
    from .serve import register_torch_op  # noqa: E402

    register_torch_op()
