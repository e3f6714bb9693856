"""``tuner.attention(q, k, v, causal=True, config="best.h")``: the function, and the PyTorch operator's registration.

:func:`attention` picks the path for the kind of its inputs (PyTorch tensors or CuPy arrays,
:mod:`._attention`). With PyTorch it is also the operator ``torch.ops.flashtune.attention``
(:mod:`._torch_op`), which :func:`register_torch_op` defines: importing ``tuner`` does when
PyTorch is already imported, and so does the first call of :func:`attention` on tensors.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..devices import DeviceLimits
from ..problem import Problem
from ..space import AUTO_FAMILY, Config, Space, SpaceError, load_space
from ._attention import AttentionError, completed, cupy_attention, torch_attention
from ._tuned import TunedConfigs

__all__ = ["attention", "register_torch_op", "resolve_config"]


def resolve_config(
    space: Space,
    config: Mapping[str, Any] | str | Path | None,
    head_dim: int | None = None,
    *,
    problem: Problem | None = None,
    device: DeviceLimits | None = None,
) -> Config:
    """None: the family's defaults (for ``head_dim``); a mapping: those knobs, the others at their defaults, or
    given a ``problem`` and a ``device``, completed as ``tuner.attention`` completes it (:func:`tuner.space.complete`:
    the defaults nearest that run, the moved ones logged); a path: an exported header."""
    if config is None:
        return space.defaults(head_dim)
    if isinstance(config, (str, Path)):
        from ..export import read_header

        return read_header(config, space)
    if isinstance(config, Mapping):
        if problem is not None and device is not None:
            return completed(space, config, problem, device)
        return space.validate(config, partial=True, head_dim=head_dim)
    raise AttentionError(
        f"config must be None, a dict of knob values or the path of an exported header, not {type(config).__name__}"
    )


def attention(
    q,
    k,
    v,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    family: str = "auto",
    config: Mapping[str, Any] | str | Path | None = None,
    tuned: TunedConfigs | str | Path | None = None,
    return_lse: bool = False,
    kernels: str | Path | Sequence[str | Path] | None = None,
):
    """Forward attention ``softmax(scale * Q K^T + mask) V`` with a flashtune kernel.

    Args:
        q: ``[batch, seqlen_q, heads_q, head_dim]`` CuPy array or PyTorch CUDA tensor, fp16 or bf16.
        k, v: ``[batch, seqlen_k, heads_kv, head_dim]``, same kind and dtype; ``heads_kv`` divides ``heads_q``.
        causal: bottom-right aligned causal mask (query ``i`` sees key ``j <= i + seqlen_k - seqlen_q``).
        softmax_scale: default ``1 / sqrt(head_dim)``.
        family: ``"auto"`` (the family a header or tuned table names, else the fastest family that runs on the
            device: :func:`tuner.space.choose_family`), a kernel family (a file in ``search_spaces/``) or the
            path of a space file.
        config: None (the family's defaults), a dict of knob values (the others at their defaults, or where those
            cannot run beside the given ones the nearest that do, logged: :func:`tuner.space.complete`), the
            path of a header written by ``flashtune export`` (made for this head dim, dtype and mask; it names its
            family), or ``"auto"``: the tuned config of the bucket this shape falls in, as the dispatch header's
            ``select()`` picks it; a shape the table does not cover gets the family default with one
            :class:`AutoConfigWarning` per launch plan.
        tuned: with ``config="auto"``: the ``.json`` that ``flashtune export --dispatch -o x.h`` writes beside
            the header, a suite file, a storage URL, or a :class:`tuner.serve.TunedConfigs`; without it the
            table shipped with flashtune for the device's GPU (:func:`tuner.serve.shipped_tuned`).
        return_lse: also return the natural-log log-sum-exp, fp32 ``[batch, heads_q, seqlen_q]``.
        kernels: a kernel directory of your own (or a list of them), searched for ``family`` before the
            package and ``$FLASHTUNE_KERNELS``; needs ``family`` to name the family (not ``"auto"``).

    Returns:
        O like ``q`` (same kind, dtype, device; contiguous), or ``(O, LSE)`` with ``return_lse``.

    Raises:
        AttentionError: inputs or config this kernel cannot run (one line); also for tensors that require
            grad while grad mode is on: the kernels are forward-only.

    Example:
        >>> import torch, tuner
        >>> q, k, v = (torch.randn(2, 1024, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        >>> o = tuner.attention(q, k, v, causal=True, config="studies/best.h")
    """
    if kernels is not None:
        family = _family_in(family, kernels)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(q, torch.Tensor):
        o, lse = torch_attention(
            torch, q, k, v, bool(causal), softmax_scale, family, config, tuned, return_lse, register_torch_op
        )
    else:
        o, lse = cupy_attention(q, k, v, bool(causal), softmax_scale, family, config, tuned, return_lse)
    return (o, lse) if return_lse else o


def _family_in(family: str, kernels: str | Path | Sequence[str | Path]) -> str:
    """The space file of ``family`` found in the ``kernels`` directories first (then the package)."""
    if family == AUTO_FAMILY:
        raise AttentionError('kernels= needs family= naming the family to run (not "auto")')
    try:
        return str(load_space(family, kernels=kernels).path)
    except SpaceError as e:
        raise AttentionError(str(e)) from None


_registering = threading.Lock()  # two threads' first calls on tensors register the operator once


def register_torch_op() -> bool:
    """Register ``torch.ops.flashtune.attention`` and have ``torch.compile`` trace :func:`attention` on tensors
    as it (once per process; later calls only answer). False on a PyTorch without ``torch.library.custom_op``
    (before 2.4), where :func:`attention` still works eagerly."""
    with _registering:
        return _register_once()


@functools.cache
def _register_once() -> bool:
    try:
        from ._torch_op import trace_as_operator
    except (ImportError, AttributeError):
        return False
    trace_as_operator(attention)
    return True
