"""Call a flashtune kernel from Python: ``tuner.attention(q, k, v, causal=True, config="best.h")``.

Inputs are CuPy arrays or PyTorch CUDA tensors of shape ``[batch, seqlen, heads, head_dim]``
(K and V may have fewer heads: grouped-query attention), fp16 or bf16, last dimension
contiguous. PyTorch tensors are shared with CuPy through DLPack, without a copy; CuPy has no
bfloat16, so bf16 is passed as its raw 16-bit pattern (a CuPy bf16 array is ``uint16`` or
``int16`` holding the bits, as :mod:`tuner.gpu.tensors` makes them). The result has the
kind, dtype and device of ``q``.

The kernel is compiled for the current device through :func:`tuner.compile.compile_config`
(the on-disk cubin cache makes that a lookup after the first call) and launched on the
current stream (PyTorch's current stream for tensors). Importing this module needs no GPU.
"""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import FlashtuneError
from .problem import Problem
from .space import Config, Space, config_key, load_space

__all__ = ["AttentionError", "attention", "resolve_config"]


class AttentionError(FlashtuneError, ValueError):
    """The inputs or the config cannot run on this kernel family and device."""


def resolve_config(space: Space, config: None | Mapping[str, Any] | str | Path, head_dim: int | None = None) -> Config:
    """None: the family's defaults (for ``head_dim``); a mapping: those knobs (others default); a path: an
    exported header."""
    if config is None:
        return space.defaults(head_dim)
    if isinstance(config, (str, Path)):
        from .export import read_header  # deferred: imports Optuna

        return read_header(config, space)
    if isinstance(config, Mapping):
        return space.validate(config, partial=True, head_dim=head_dim)
    raise AttentionError(f"config must be None, a dict of knob values or the path of an exported header, "
                         f"not {type(config).__name__}")


# -- inputs ------------------------------------------------------------------------------------
def _is_torch(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def _torch_to_cupy(t):
    """A CuPy view of a CUDA tensor (bf16 as uint16 bits) and the tensor's dtype name."""
    import cupy
    import torch

    if not t.is_cuda:
        raise AttentionError(f"tensors must be on a CUDA device, got {t.device}")
    if t.dtype == torch.float16:
        return cupy.from_dlpack(t.detach()), "fp16"
    if t.dtype == torch.bfloat16:
        return cupy.from_dlpack(t.detach().view(torch.int16)).view(cupy.uint16), "bf16"
    raise AttentionError(f"tensors must be float16 or bfloat16, got {t.dtype}")


def _torch_stream(stream):
    """PyTorch's stream as a CuPy stream, so that the kernel is ordered with the caller's PyTorch work."""
    import cupy

    if hasattr(stream, "__cuda_stream__") and hasattr(cupy.cuda.Stream, "from_external"):
        return cupy.cuda.Stream.from_external(stream)
    with warnings.catch_warnings():  # CuPy 14 deprecates ExternalStream in favour of from_external
        warnings.simplefilter("ignore", DeprecationWarning)
        return cupy.cuda.ExternalStream(stream.cuda_stream)


def _cupy_dtype(x) -> str:
    import cupy

    if x.dtype == cupy.float16:
        return "fp16"
    if x.dtype in (cupy.uint16, cupy.int16) or str(x.dtype) == "bfloat16":
        return "bf16"
    raise AttentionError(f"arrays must be float16, or bf16 bits as uint16/int16, got {x.dtype}")


def _as_cupy(x):
    """(CuPy view the kernels can address, dtype name). An input they cannot address is copied
    first, on the stream of its own library, which is the stream the kernel is launched on."""
    import cupy

    if _is_torch(x):
        if x.dim() == 4 and not _kernel_addressable(x.data_ptr(), [s * x.element_size() for s in x.stride()],
                                                    x.element_size()):
            import torch

            x = x.clone(memory_format=torch.contiguous_format)
        x, dtype = _torch_to_cupy(x)
    elif isinstance(x, cupy.ndarray):
        dtype = _cupy_dtype(x)
        if x.dtype != cupy.float16:
            x = x.view(cupy.uint16)
        if x.ndim == 4 and not _kernel_addressable(x.data.ptr, x.strides, x.itemsize):
            x = x.copy()  # a fresh, C-contiguous, aligned array (ascontiguousarray keeps a contiguous one as is)
    else:
        raise AttentionError(f"inputs must be CuPy arrays or PyTorch tensors, got {type(x).__name__}")
    return x, dtype


def _kernel_addressable(ptr: int, strides_bytes, itemsize: int) -> bool:
    """What every family's 16-byte loads (cp.async, TMA) need: a contiguous last dimension, a 16-byte
    aligned base and row/head/batch strides that are multiples of 16 bytes. Otherwise a copy is made."""
    return (strides_bytes[3] == itemsize and ptr % 16 == 0
            and all(stride % 16 == 0 for stride in strides_bytes[:3]))


def _problem(q, k, v, dtypes: tuple[str, str, str], causal: bool) -> Problem:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            raise AttentionError(f"{name} must be [batch, seqlen, heads, head_dim], got shape {tuple(x.shape)}")
    if len(set(dtypes)) != 1:
        raise AttentionError(f"q, k and v must share a dtype, got {', '.join(dtypes)}")
    if k.shape != v.shape:
        raise AttentionError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise AttentionError(f"k and v must match q in batch and head_dim: q {tuple(q.shape)}, k {tuple(k.shape)}")
    batch, seqlen_q, heads_q, head_dim = (int(s) for s in q.shape)
    try:
        return Problem(batch=batch, seqlen_q=seqlen_q, seqlen_k=int(k.shape[1]), heads_q=heads_q,
                       heads_kv=int(k.shape[2]), head_dim=head_dim, dtype=dtypes[0], causal=bool(causal))
    except FlashtuneError as e:
        raise AttentionError(str(e)) from None


# -- kernels -----------------------------------------------------------------------------------
_lock = threading.Lock()
_limits: dict[int, Any] = {}
_cubins: dict[tuple, tuple[str, str]] = {}
_modules: dict[tuple[int, str], Any] = {}


def _device_limits(device_id: int):
    from .devices import DeviceLimits
    from .gpu.info import gpu_info

    with _lock:
        if device_id not in _limits:
            _limits[device_id] = DeviceLimits.from_info(gpu_info())
        return _limits[device_id]


def _function(space: Space, config: Config, problem: Problem, device, device_id: int):
    """The kernel function for (config, problem macros) on this device: compiled once, loaded once per device."""
    import cupy

    from .compile import compile_config

    macros = space.macros(config, problem, device)
    key = (str(space.path), config_key(config), tuple(sorted(macros.items())), device.arch)
    with _lock:
        if key not in _cubins:
            kernel = compile_config(space, config, problem, device)
            _cubins[key] = (kernel.cubin_path, kernel.entry)
        cubin_path, entry = _cubins[key]
        if (device_id, cubin_path) not in _modules:
            module = cupy.cuda.function.Module()
            module.load_file(cubin_path)
            _modules[(device_id, cubin_path)] = module
        return _modules[(device_id, cubin_path)].get_function(entry)


def attention(q, k, v, *, causal: bool = False, softmax_scale: float | None = None, family: str = "sm80",
              config: None | Mapping[str, Any] | str | Path = None, return_lse: bool = False):
    """Forward attention ``softmax(scale * Q K^T + mask) V`` with a flashtune kernel.

    Args:
        q: ``[batch, seqlen_q, heads_q, head_dim]`` CuPy array or PyTorch CUDA tensor, fp16 or bf16.
        k, v: ``[batch, seqlen_k, heads_kv, head_dim]``, same kind and dtype; ``heads_kv`` divides ``heads_q``.
        causal: bottom-right aligned causal mask (query ``i`` sees key ``j <= i + seqlen_k - seqlen_q``).
        softmax_scale: default ``1 / sqrt(head_dim)``.
        family: kernel family (a file in ``search_spaces/``).
        config: None (the family's defaults), a dict of knob values (others default), or the path of a
            header written by ``flashtune export``.
        return_lse: also return the natural-log log-sum-exp, fp32 ``[batch, heads_q, seqlen_q]``.

    Returns:
        O like ``q`` (same kind, dtype, device), or ``(O, LSE)`` with ``return_lse``.

    Example:
        >>> import torch, tuner
        >>> q, k, v = (torch.randn(2, 1024, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        >>> o = tuner.attention(q, k, v, causal=True, config="studies/best.h")
    """
    import cupy

    from .gpu.launch import Kernel

    space = load_space(family)
    torch_input = _is_torch(q)
    if any(_is_torch(x) != torch_input for x in (k, v)):
        raise AttentionError("q, k and v must all be CuPy arrays or all PyTorch tensors")
    if not torch_input and not all(isinstance(x, cupy.ndarray) for x in (q, k, v)):
        raise AttentionError(f"inputs must be CuPy arrays or PyTorch tensors, got {type(q).__name__}")
    device_id = q.device.index if torch_input else q.device.id
    if device_id is None:
        raise AttentionError(f"tensors must be on a CUDA device, got {q.device}")
    with cupy.cuda.Device(device_id):
        (qc, dq), (kc, dk), (vc, dv) = (_as_cupy(x) for x in (q, k, v))
        problem = _problem(qc, kc, vc, (dq, dk, dv), causal)
        reason = space.supports(problem)
        if reason:
            raise AttentionError(reason)
        chosen = resolve_config(space, config, problem.head_dim)
        device = _device_limits(device_id)
        reason = space.check(chosen, problem, device)
        if reason:
            raise AttentionError(f"config {chosen} cannot run this problem on {device.name}: {reason}")
        if torch_input:
            import torch

            o = torch.empty(tuple(q.shape), dtype=q.dtype, device=q.device)
            lse = torch.empty((problem.batch, problem.heads_q, problem.seqlen_q), dtype=torch.float32,
                              device=q.device)
            oc, lsec = _torch_to_cupy(o)[0], cupy.from_dlpack(lse)
            stream = _torch_stream(torch.cuda.current_stream(q.device))
        else:
            o = cupy.empty(q.shape, dtype=q.dtype)  # bf16 bits keep q's uint16/int16 dtype
            oc = o if o.dtype == cupy.float16 else o.view(cupy.uint16)
            lse = lsec = cupy.empty((problem.batch, problem.heads_q, problem.seqlen_q), dtype=cupy.float32)
            stream = cupy.cuda.get_current_stream()
        geometry = space.launch(chosen, problem, device)
        kernel = Kernel(_function(space, chosen, problem, device, device_id), abi=space.family.abi,
                        grid=geometry.grid, threads=geometry.threads, smem_bytes=geometry.smem_bytes, config=chosen,
                        abi_params=geometry.abi)
        scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(problem.head_dim)
        kernel.launch(kernel.args(qc, kc, vc, oc, lsec, scale), stream=stream)
    return (o, lse) if return_lse else o
