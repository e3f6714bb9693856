"""16-bit tensors on CuPy: fp16 natively, bf16 as raw uint16 bits (CuPy has no bfloat16 type).

The conversions and ``poison`` also take NumPy arrays (the CPU tests use them)."""

from __future__ import annotations

import cupy

from ..problem import DTYPES

__all__ = ["from_float32", "poison", "random_inputs", "storage_dtype", "to_float32"]


def storage_dtype(dtype: str):
    """The CuPy/NumPy dtype that holds ``dtype``'s elements (bf16: their bits, as uint16)."""
    return cupy.dtype(DTYPES[dtype].storage)


def _holds_values(dtype: str) -> bool:
    """Whether the storage type is the float type itself (fp16), not its bits (bf16)."""
    return DTYPES[dtype].storage == DTYPES[dtype].torch_name


def from_float32(x, dtype: str):
    """Round fp32 to the 16-bit type (round to nearest even for bf16)."""
    if _holds_values(dtype):
        return x.astype(storage_dtype(dtype))
    xp = cupy.get_array_module(x)
    bits = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
    rounded = (bits + cupy.uint32(0x7FFF) + ((bits >> 16) & cupy.uint32(1))) >> 16
    return rounded.astype(cupy.uint16)


def to_float32(x, dtype: str):
    if _holds_values(dtype):
        return x.astype(cupy.float32)
    return (x.astype(cupy.uint32) << 16).view(cupy.float32)


def poison(x, dtype: str | None = None) -> None:
    """Fill an output with NaN so that an element the kernel never wrote cannot pass a check."""
    if x.dtype == cupy.float32:
        x.fill(cupy.nan)
    else:
        x.view(cupy.uint16).fill(DTYPES[dtype or "fp16"].nan_bits)


def random_inputs(problem, seed: int, *, scale: float = 1.0):
    """Fresh Q, K, V of the problem's shape and dtype, standard normal times ``scale``. cuRAND's host
    generator: its kernels come compiled, where ``cupy.random.default_rng`` compiles its own on first use."""
    rng = cupy.random.RandomState(seed)
    p = problem
    shapes = (
        (p.batch, p.seqlen_q, p.heads_q, p.head_dim),
        (p.batch, p.seqlen_k, p.heads_kv, p.head_dim),
        (p.batch, p.seqlen_k, p.heads_kv, p.head_dim),
    )
    return tuple(
        from_float32(rng.standard_normal(s, dtype=cupy.float32) * cupy.float32(scale), p.dtype) for s in shapes
    )
