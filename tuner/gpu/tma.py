"""Kernel arguments of ABI ``sm90_tma`` (family sm90): CUtensorMaps for Q, K, V, O plus scalars.

The kernel signature (kernel_src/sm90/flash_fwd.cu)::

    flashtune_fwd(TmaDesc tma_q, TmaDesc tma_k, TmaDesc tma_v, TmaDesc tma_o,
                  float* lse, int seqlen_q, int seqlen_k, int heads_q, int heads_kv,
                  float softmax_scale)

Each ``TmaDesc`` is a 128-byte, 64-byte-aligned ``CUtensorMap`` passed by value
(``const __grid_constant__``); CuPy passes it from a NumPy structured scalar. Tensors are
4-D maps over ``[batch, seqlen, heads, head_dim]`` (innermost first: head_dim, seqlen,
heads, batch) with 128-byte swizzle and boxes of 64 columns, so one box row is one
128-byte swizzle row; rows past seqlen are zero-filled on load and clipped on store.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["build_args", "box_rows", "TMA_DESC_DTYPE"]

#: A CUtensorMap as a NumPy structured type: 16 x u64, 64-byte aligned.
TMA_DESC_DTYPE = np.dtype({"names": ["opaque"], "formats": [(np.uint64, 16)], "aligned": True})

_BOX_COLS = 64  # 16-bit elements in one 128-byte swizzle row


class TmaError(RuntimeError):
    """A tensor cannot be described by a tensor map, or the driver refused the encoding."""


def box_rows(params: Mapping[str, int]) -> dict[str, int]:
    """Rows of the TMA box of each tensor: the [launch.abi] values of search_spaces/sm90.toml."""
    try:
        return {"q": int(params["q_box_rows"]), "k": int(params["kv_box_rows"]), "v": int(params["kv_box_rows"]),
                "o": int(params["o_box_rows"])}
    except KeyError as e:
        raise TmaError(f"the space's [launch.abi] gives no {e.args[0]}; the sm90_tma ABI needs q_box_rows, "
                       "kv_box_rows and o_box_rows") from None


def _encode(tensor, rows_box: int):
    """A 4-D tiled tensor map over a CuPy array [batch, seqlen, heads, head_dim] (last dim contiguous)."""
    from cuda.bindings import driver  # only on machines with the CUDA driver bindings

    batch, seqlen, heads, head_dim = tensor.shape
    itemsize = tensor.itemsize
    if itemsize != 2:
        raise TmaError(f"tensor maps here describe 16-bit tensors, got itemsize {itemsize}")
    if tensor.strides[3] != itemsize:
        raise TmaError(f"the last dimension must be contiguous, strides are {tensor.strides}")
    if head_dim % _BOX_COLS:
        raise TmaError(f"head_dim {head_dim} must be a multiple of {_BOX_COLS}")
    if tensor.data.ptr % 16:
        raise TmaError("tensor base address must be 16-byte aligned")
    row_stride, head_stride, batch_stride = tensor.strides[1], tensor.strides[2], tensor.strides[0]
    for name, s in (("row", row_stride), ("head", head_stride), ("batch", batch_stride)):
        if s % 16 or s <= 0 or s >= 1 << 40:
            raise TmaError(f"{name} stride {s} B must be a positive multiple of 16 below 2^40")
    if max(rows_box, 1) > 256:
        raise TmaError(f"box of {rows_box} rows exceeds the TMA limit of 256")

    dtype = (driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16 if tensor.dtype == np.float16
             else driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16)  # bf16 is stored as uint16
    err, tmap = driver.cuTensorMapEncodeTiled(
        dtype,
        4,
        tensor.data.ptr,
        [driver.cuuint64_t(x) for x in (head_dim, seqlen, heads, batch)],
        [driver.cuuint64_t(x) for x in (row_stride, head_stride, batch_stride)],
        [driver.cuuint32_t(x) for x in (_BOX_COLS, rows_box, 1, 1)],
        [driver.cuuint32_t(1)] * 4,
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    if err != driver.CUresult.CUDA_SUCCESS:
        raise TmaError(f"cuTensorMapEncodeTiled failed: {err} (shape {tensor.shape}, strides {tensor.strides}, "
                       f"box rows {rows_box})")
    return _as_struct(tmap)


def _as_struct(tmap) -> np.void:
    """The 128 bytes of a CUtensorMap as a NumPy structured scalar (passed by value by CuPy)."""
    words = getattr(tmap, "opaque", None)
    if words is None:  # older bindings: read through the pointer
        import ctypes

        words = (ctypes.c_uint64 * 16).from_address(int(tmap.getPtr()))
    out = np.zeros((), dtype=TMA_DESC_DTYPE)
    out["opaque"] = np.asarray([int(w) for w in words], dtype=np.uint64)
    return out[()]  # a np.void scalar: CuPy copies its 128 bytes into the parameter buffer


def build_args(q, k, v, o, lse, *, softmax_scale: float, params: Mapping[str, int]) -> tuple:
    """Kernel arguments for one launch. q/o: [batch, seqlen_q, heads_q, D]; k/v: [batch, seqlen_k, heads_kv, D];
    lse: fp32 [batch, heads_q, seqlen_q], contiguous."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    _, seqlen_k, heads_kv, _ = k.shape
    if o.shape != q.shape or v.shape != k.shape or k.shape[0] != batch or k.shape[3] != head_dim:
        raise TmaError(f"shapes disagree: q {q.shape}, k {k.shape}, v {v.shape}, o {o.shape}")
    if heads_q % heads_kv:
        raise TmaError(f"heads_kv {heads_kv} must divide heads_q {heads_q}")
    if lse.shape != (batch, heads_q, seqlen_q) or lse.dtype != np.float32 or not lse.flags.c_contiguous:
        raise TmaError(f"lse must be contiguous fp32 {(batch, heads_q, seqlen_q)}, got {lse.dtype} {lse.shape}")
    rows = box_rows(params)
    return (
        _encode(q, rows["q"]),
        _encode(k, rows["k"]),
        _encode(v, rows["v"]),
        _encode(o, rows["o"]),
        lse,
        np.int32(batch),
        np.int32(seqlen_q),
        np.int32(seqlen_k),
        np.int32(heads_q),
        np.int32(heads_kv),
        np.float32(softmax_scale),
    )
