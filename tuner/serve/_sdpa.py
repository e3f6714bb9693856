"""``tuner.sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` on flashtune kernels, with fallback.

:func:`sdpa` takes what PyTorch's SDPA takes (``[B, H, N, D]`` in and out, ``attn_mask``,
``dropout_p``, ``is_causal``, ``scale``, ``enable_gqa``) and means what it means. Inputs that are
transposed views of ``[B, N, H, D]`` (what models make with ``x.view(B, N, H, D).transpose(1, 2)``)
reach the kernels without a copy: the kernels take the batch, row and head strides (both ABIs,
kernel_src/README.md), so the ``[B, N, H, D]`` view of such a tensor is passed as it is; the output
is the kernel's contiguous ``[B, N, H, D]`` O, returned as its ``[B, H, N, D]`` view.

Whatever the kernels cannot do goes to PyTorch's own SDPA with the same arguments, and the reason
is counted (:func:`sdpa_fallbacks`) and logged once per reason (logger ``flashtune``, a
:class:`SdpaFallbackWarning` too):

- ``attn_mask``: a mask tensor; ``dropout``: ``dropout_p > 0``; ``grad``: grad mode with an input
  that requires grad (the kernels are forward-only); ``cpu``: an input not on a CUDA device;
- ``dtype``: not fp16/bf16, or mixed; ``head_dim``: a head dim no family that runs on the device
  has (or V's differs from Q's); ``shape``: not 4-D, empty, or batches, lengths or heads that do not
  pair up (PyTorch then raises its own error, or broadcasts);
- ``causal_alignment``: ``is_causal`` with ``N_q != N_k``: PyTorch's mask is top-left aligned
  (query ``i`` sees keys ``j <= i``), the kernels' bottom-right (``j <= i + N_k - N_q``);
- ``layout``: strides the kernels cannot address (last dimension not contiguous, strides not
  multiples of 16 bytes or not positive, a base address not 16-byte aligned).

:func:`sdpa_patched` routes ``torch.nn.functional.scaled_dot_product_attention`` through
:func:`sdpa` inside a ``with`` block. Importing this module imports no PyTorch: the first call does.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import warnings
from collections import Counter
from collections.abc import Iterator
from typing import Any

from ..problem import Problem
from ..space import AUTO_FAMILY, SpaceError, load_space, rank_families
from ._api import attention, register_torch_op
from ._attention import torch_sdpa_launch

__all__ = [
    "FALLBACK_REASONS",
    "SdpaFallbackWarning",
    "count_fallback",
    "kernel_refusal",
    "reset_sdpa_fallbacks",
    "run_checked",
    "sdpa",
    "sdpa_fallbacks",
    "sdpa_patched",
]

log = logging.getLogger("flashtune")

#: every reason :func:`sdpa` falls back for, and what it means (the README lists them)
FALLBACK_REASONS = {
    "attn_mask": "an attn_mask tensor (the kernels take no mask but the causal one)",
    "dropout": "dropout_p > 0 (the kernels have no dropout)",
    "grad": "grad mode with inputs that require grad (the kernels are forward-only)",
    "cpu": "inputs not on a CUDA device",
    "dtype": "a dtype other than float16/bfloat16, or q, k, v of different dtypes",
    "head_dim": "a head dim no kernel family that runs on this device has, or V's head dim differing from Q's",
    "shape": "not [B, H, N, D] tensors of matching batch, heads (enable_gqa: dividing) and key/value lengths",
    "causal_alignment": "is_causal with N_q != N_k: PyTorch's mask is top-left aligned, the kernels' bottom-right",
    "layout": "strides the kernels cannot address (last dim not contiguous, strides not 16-byte multiples)",
    "transformers_option": "a transformers attention option the kernels lack (softcap, position_bias)",
}


class SdpaFallbackWarning(UserWarning):
    """:func:`tuner.sdpa` ran PyTorch's SDPA for a reason first seen now (once per reason)."""


_counts: Counter[str] = Counter()
_counts_lock = threading.Lock()
_torch_sdpa: Any = None  # PyTorch's own SDPA, saved before any patch
_marked = False  # the host lookups are marked for torch.compile (_mark_host_lookups)
_arch: dict[int, int] = {}  # CUDA device index -> compute capability x10
_head_dims: dict[tuple, bool] = {}  # (family, arch, head_dim, dtype) -> some family runs it


def sdpa_fallbacks() -> dict[str, int]:
    """How many calls of :func:`sdpa` (and of the transformers attention) went to PyTorch, by reason."""
    with _counts_lock:
        return dict(_counts)


def reset_sdpa_fallbacks() -> None:
    """Forget the counts (the next fallback of each reason is reported again)."""
    with _counts_lock:
        _counts.clear()


def count_fallback(reason: str, torch) -> None:
    """Count a fallback; report the first of each reason (never inside torch.compile's tracing)."""
    if torch.compiler.is_compiling():
        return
    with _counts_lock:
        _counts[reason] += 1
        first = _counts[reason] == 1
    if first:
        message = f"flashtune sdpa: PyTorch's SDPA runs calls with {FALLBACK_REASONS[reason]} (reason {reason!r})"
        log.info(message)
        warnings.warn(message, SdpaFallbackWarning, stacklevel=3)


def _torch():
    global _torch_sdpa
    torch = sys.modules["torch"]
    if _torch_sdpa is None:  # the builtin F.scaled_dot_product_attention is, whoever patched F since
        _torch_sdpa = torch._C._nn.scaled_dot_product_attention
    if not _marked and not torch.compiler.is_compiling():
        _mark_host_lookups(torch)
    return torch


def _cuda_device(q, k, v) -> int:
    """The CUDA device index of q, k and v, -1 unless all three are on that one CUDA device (device indices
    compared as integers: no torch.device object is made)."""
    if not (q.is_cuda and k.is_cuda and v.is_cuda):
        return -1
    index = q.get_device()
    return index if k.get_device() == index and v.get_device() == index else -1


def _device_arch(index: int) -> int:
    """The compute capability x10 of CUDA device ``index`` (asked once; plain arguments: a torch.compile
    constant, see :func:`_mark_host_lookups`)."""
    arch = _arch.get(index)
    if arch is None:
        major, minor = sys.modules["torch"].cuda.get_device_capability(index)
        arch = _arch[index] = major * 10 + minor
    return arch


def _family_runs(family: Any, arch: int, head_dim: int, dtype: str) -> bool:
    """Whether ``family`` (or for ``"auto"`` any family that runs on sm_``arch``) has this head dim and dtype."""
    key = (family, arch, head_dim, dtype)
    found = _head_dims.get(key)
    if found is None:
        probe = Problem(batch=1, seqlen_q=1, heads_q=1, head_dim=head_dim, dtype=dtype)
        try:
            spaces = None if family == AUTO_FAMILY else [load_space(family)]
        except SpaceError:
            return True  # an unknown family: let the kernel path raise its one-line error
        found = _head_dims[key] = bool(rank_families(arch, probe, spaces))
    return found


def _mark_host_lookups(torch) -> None:
    """The lookups of space files and of the driver give constants while torch.compile traces a call: it
    calls them instead of tracing into them (file reads would break the graph). Done eagerly, before any
    tracing: when this module is imported after PyTorch, else at the first eager call."""
    global _marked
    for lookup in (_family_runs, _device_arch):
        torch.compiler.assume_constant_result(lookup)
    _marked = True


_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(torch, dtype) -> str | None:
    if not _DTYPE_NAMES:
        _DTYPE_NAMES.update({torch.float16: "fp16", torch.bfloat16: "bf16"})
    return _DTYPE_NAMES.get(dtype)


def _addressable(x, tracing: bool) -> bool:
    """Whether the kernels read the ``[B, N, H, D]`` view of this ``[B, H, N, D]`` tensor as it is (16-bit
    elements: strides in multiples of 8 elements are 16-byte multiples)."""
    s0, s1, s2, s3 = x.stride()
    if s3 != 1 or s0 <= 0 or s1 <= 0 or s2 <= 0 or s0 % 8 or s1 % 8 or s2 % 8:
        return False
    return tracing or x.data_ptr() % 16 == 0


def kernel_refusal(
    torch, q, k, v, attn_mask, dropout_p, is_causal, enable_gqa, family, tracing: bool | None = None
) -> str | None:
    """Why the kernels cannot run this SDPA call (a key of :data:`FALLBACK_REASONS`), or None. ``tracing``:
    whether torch.compile is tracing the call (None: asked here)."""
    if attn_mask is not None:
        return "attn_mask"
    if dropout_p:
        return "dropout"
    tensor = torch.Tensor
    if (
        not (type(q) is tensor and type(k) is tensor and type(v) is tensor)
        or q.dim() != 4
        or k.dim() != 4
        or v.dim() != 4
    ):
        return "shape"  # subclasses (nested, fake, functional) and other ranks: PyTorch's business
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return "grad"
    device = _cuda_device(q, k, v)
    if device < 0:
        return "cpu"
    dtype = _dtype_name(torch, q.dtype)
    if dtype is None or not q.dtype == k.dtype == v.dtype:
        return "dtype"
    b, h, n, d = q.shape
    bk, hk, nk, dk = k.shape
    if tuple(v.shape[:3]) != (bk, hk, nk) or bk != b or dk != d or not b * h * n * nk * d:
        return "shape"
    if hk != h and not (enable_gqa and h % hk == 0):
        return "shape"
    if v.shape[3] != d:
        return "head_dim"
    if is_causal and n != nk:
        return "causal_alignment"
    if not _family_runs(family, _device_arch(device), d, dtype):
        return "head_dim"
    if tracing is None:  # no addresses while tracing: the operator copies a misaligned one
        tracing = torch.compiler.is_compiling()
    if not (_addressable(q, tracing) and _addressable(k, tracing) and _addressable(v, tracing)):
        return "layout"
    return None


def sdpa(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    family: str = AUTO_FAMILY,
    config: Any = "auto",
    tuned: Any = None,
):
    """``torch.nn.functional.scaled_dot_product_attention`` on flashtune kernels: ``[B, H, N, D]`` in and out.

    The first seven arguments are PyTorch's, with its semantics (``is_causal`` top-left aligned,
    ``scale`` default ``1/sqrt(D)``, ``enable_gqa``: K/V heads dividing Q's, query head ``h`` reading
    K/V head ``h // (H_q / H_kv)``). ``family``, ``config`` and ``tuned`` are :func:`tuner.attention`'s
    (default: the fastest family on the device, its tuned configs from the table shipped for the GPU).
    Calls the kernels cannot run go to PyTorch's SDPA (module docstring; :func:`sdpa_fallbacks`).

    Example:
        >>> q, k, v = (torch.randn(2, 1024, 8, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in "qkv")
        >>> o = tuner.sdpa(q, k, v, is_causal=True)  # [2, 8, 1024, 128], no copy of q, k or v
    """
    torch = _torch()
    tracing = torch.compiler.is_compiling()
    reason = kernel_refusal(torch, query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, family, tracing)
    if reason is not None:
        count_fallback(reason, torch)
        return _torch_sdpa(
            query,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )
    return run_checked(
        torch, query, key, value, bool(is_causal), scale, tracing, family=family, config=config, tuned=tuned
    )


def run_checked(
    torch,
    query,
    key,
    value,
    causal: bool,
    scale,
    tracing: bool,
    *,
    family: str = AUTO_FAMILY,
    config: Any = "auto",
    tuned: Any = None,
):
    """:func:`sdpa`'s kernel path for a call that :func:`kernel_refusal` passed (``tracing``: what it was told),
    for callers that made that check themselves (each check costs a few microseconds of host time per call);
    ``family``, ``config`` and ``tuned`` as :func:`sdpa`'s."""
    if not tracing:  # eager: straight to the launch, the checks are all it needs
        return torch_sdpa_launch(
            torch, query, key, value, causal, scale, family, config, tuned,
            query.get_device(), register_torch_op,  # the checks put q, k and v on this one CUDA device
        )  # fmt: skip
    o = attention(
        query.transpose(1, 2),
        key.transpose(1, 2),
        value.transpose(1, 2),
        causal=causal,
        softmax_scale=scale,
        family=family,
        config=config,
        tuned=tuned,
    )
    return o.transpose(1, 2)


# -- routing F.scaled_dot_product_attention through sdpa --------------------------------------------------
_patch_lock = threading.Lock()
# (token, options) of the open sdpa_patched blocks, oldest first: a tuple rebound under the lock, read without it
_active: tuple[tuple[object, dict[str, Any]], ...] = ()


def _patched(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """What ``F.scaled_dot_product_attention`` is inside :func:`sdpa_patched`: :func:`sdpa` with the options
    of the innermost open block."""
    active = _active
    options = active[-1][1] if active else {}
    return sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, **options)


@contextlib.contextmanager
def sdpa_patched(*, family: str = AUTO_FAMILY, config: Any = "auto", tuned: Any = None) -> Iterator[None]:
    """Inside the block, ``torch.nn.functional.scaled_dot_product_attention`` is :func:`sdpa` (with these
    options): a model that calls SDPA runs flashtune kernels, unchanged. Blocks nest (the innermost's options
    apply) and may be opened from several threads; the last one to close puts PyTorch's function back.
    The patch is process-wide: while any block is open, every thread's SDPA calls go through :func:`sdpa`."""
    global _active
    torch = _torch()
    functional = torch.nn.functional
    token = object()
    with _patch_lock:
        if not _active:
            functional.scaled_dot_product_attention = _patched
        _active = (*_active, (token, {"family": family, "config": config, "tuned": tuned}))
    try:
        yield
    finally:
        with _patch_lock:
            _active = tuple(entry for entry in _active if entry[0] is not token)
            if not _active and functional.scaled_dot_product_attention is _patched:
                functional.scaled_dot_product_attention = _torch_sdpa


if "torch" in sys.modules:  # PyTorch is loaded already: ready for torch.compile before any call
    _mark_host_lookups(sys.modules["torch"])
