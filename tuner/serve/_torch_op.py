"""``torch.ops.flashtune.attention``: a flashtune forward kernel as a PyTorch operator.

::

    import torch, tuner
    o, lse = torch.ops.flashtune.attention(q, k, v, causal=True, config="best.h")

Schema: ``flashtune::attention(Tensor q, Tensor k, Tensor v, bool causal=False,
float? softmax_scale=None, str family="auto", str? config=None, str? tuned=None) -> (Tensor, Tensor)``:
O (contiguous, like ``q``) and the fp32 LSE ``[batch, heads_q, seqlen_q]``; the arguments mean
what they mean for :func:`tuner.attention` (``config``: None, a header path or ``"auto"`` with
``tuned`` a dispatch JSON, suite file or storage URL; a dict of knobs cannot cross the schema).

It is registered through ``torch.library.custom_op`` with a fake implementation (shapes and
dtypes only), so ``torch.compile(fullgraph=True)`` traces it without a graph break; a call of
:func:`tuner.attention` on tensors inside a compiled function is traced as this operator.
The kernels are forward-only: inputs that require grad (with grad mode on) raise
:class:`tuner.serve.AttentionError` instead of being detached silently.

Importing this module defines the operator; :func:`tuner.serve.register_torch_op` imports it
and hands it :func:`tuner.attention` for Dynamo to trace as the operator
(:func:`trace_as_operator`). Importing ``tuner`` does that when PyTorch is already imported,
and so does the first call of :func:`tuner.attention` on tensors.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from ..problem import DTYPES
from ._attention import FORWARD_ONLY, AttentionError, torch_attention

__all__ = ["attention", "trace_as_operator"]

_DTYPES = tuple(getattr(torch, d.torch_name) for d in DTYPES.values())


def _run(
    q, k, v, causal: bool, softmax_scale: float | None, family: str, config: str | None, tuned: str | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The real computation: :func:`tuner.attention` on tensors (a module-level name, so tests can stand in for
    the GPU)."""
    return torch_attention(torch, q, k, v, bool(causal), softmax_scale, family, config, tuned, want_lse=True)


@torch.library.custom_op("flashtune::attention", mutates_args=())
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    family: str = "auto",
    config: str | None = None,
    tuned: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward attention; (O, LSE). See :func:`tuner.attention`."""
    return _run(q, k, v, causal, softmax_scale, family, config, tuned)


@attention.register_fake
def _attention_fake(q, k, v, causal=False, softmax_scale=None, family="auto", config=None, tuned=None):
    """Shapes and dtypes of the result, after the checks that need no data (as :func:`tuner.attention` does them)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 4:
            raise AttentionError(f"{name} must be [batch, seqlen, heads, head_dim], got shape {tuple(x.shape)}")
        if x.dtype not in _DTYPES:
            raise AttentionError(f"tensors must be float16 or bfloat16, got {x.dtype}")
    if not q.dtype == k.dtype == v.dtype:
        raise AttentionError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape:
        raise AttentionError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise AttentionError(f"k and v must match q in batch and head_dim: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if q.shape[2] % k.shape[2] != 0:
        raise AttentionError(f"heads_kv ({k.shape[2]}) must divide heads_q ({q.shape[2]}) for grouped-query attention")
    batch, seqlen_q, heads_q, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((batch, heads_q, seqlen_q), dtype=torch.float32)


def _no_backward(ctx, grad_o, grad_lse):
    raise AttentionError(FORWARD_ONLY)


def _setup_context(ctx, inputs, output) -> None:
    raise AttentionError(FORWARD_ONLY)  # reached only when an input requires grad with grad mode on


attention.register_autograd(_no_backward, setup_context=_setup_context)


def _text(value, what: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise AttentionError(
        f"inside torch.compile, {what} must be None or a string (a path, 'auto', a URL): the "
        f"operator's schema takes strings, not {type(value).__name__}"
    )


def _attention_traced(
    q,
    k,
    v,
    *,
    causal=False,
    softmax_scale=None,
    family="auto",
    config=None,
    tuned=None,
    return_lse=False,
    kernels=None,
):
    """What Dynamo traces in place of :func:`tuner.attention` on tensors: the operator."""
    if kernels is not None:
        raise AttentionError(
            "inside torch.compile, kernels= is not taken (the operator's schema has no place for it): set "
            "FLASHTUNE_KERNELS to the kernel directory and pass family= by name"
        )
    o, lse = torch.ops.flashtune.attention(
        q, k, v, bool(causal), softmax_scale, _text(family, "family"), _text(config, "config"), _text(tuned, "tuned")
    )
    return (o, lse) if return_lse else o


def trace_as_operator(function: Callable[..., object]) -> None:
    """Have Dynamo trace ``function`` (:func:`tuner.attention`, whose signature :func:`_attention_traced` shares)
    on tensors as the operator, on PyTorch >= 2.5 (``torch.compiler.substitute_in_graph``). Once per function:
    a second registration is refused by Dynamo."""
    substitute = getattr(torch.compiler, "substitute_in_graph", None)
    if substitute is not None:
        substitute(function)(_attention_traced)
