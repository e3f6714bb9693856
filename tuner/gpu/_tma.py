"""Tensor maps (``CUtensorMap``) for ABI ``sm90_tma`` (family sm90), encoded by the CUDA driver.

The kernel signature (kernel_src/sm90/flash_fwd.cu)::

    flashtune_fwd(TmaDesc tma_q, TmaDesc tma_k, TmaDesc tma_v, TmaDesc tma_o,
                  float* lse, int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv,
                  float softmax_scale)

Each ``TmaDesc`` is a 128-byte, 64-byte-aligned ``CUtensorMap`` passed by value
(``const __grid_constant__``). Tensors are 4-D maps over ``[batch, seqlen, heads, head_dim]``
(innermost first: head_dim, seqlen, heads, batch) with 128-byte swizzle and boxes of 64
columns, so one box row is one 128-byte swizzle row; rows past seqlen are zero-filled on load
and clipped on store.

A :class:`TensorMapSlot` is one map at a fixed place of a kernel-parameter buffer, for a fixed
shape, dtype and box: per launch only the base address and the strides change, and
``cuTensorMapEncodeTiled`` is called through ctypes straight into the buffer (a few hundred
nanoseconds, where the cuda-python wrappers cost microseconds); the encoded bytes of the
last few (address, strides) are remembered, since a model calls with the same buffers again.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Mapping

from ..problem import DTYPES

__all__ = ["TMA_DESC_ALIGN", "TMA_DESC_BYTES", "TensorMapSlot", "TmaError", "box_rows", "encoder"]

TMA_DESC_BYTES = 128  # sizeof(CUtensorMap)
TMA_DESC_ALIGN = 64  # alignof(CUtensorMap)
_BOX_COLS = 64  # 16-bit elements in one 128-byte swizzle row
_MAX_BOX_ROWS = 256
_MAX_STRIDE_BYTES = 1 << 40
_REMEMBERED = 64  # encoded maps remembered per slot

#: the driver's name and cuda.h values (tests/gpu/test_launch.py checks them against cuda.h)
LIBCUDA = "libcuda.so.1"
CU_TENSOR_MAP_DATA_TYPE = {name: d.tma_data_type for name, d in DTYPES.items()}  # _FLOAT16, _BFLOAT16
CU_TENSOR_MAP_INTERLEAVE_NONE = 0
CU_TENSOR_MAP_SWIZZLE_128B = 3
CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3
CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0


class TmaError(RuntimeError):
    """A tensor cannot be described by a tensor map, or the driver refused the encoding."""


def box_rows(params: Mapping[str, int]) -> dict[str, int]:
    """Rows of the TMA box of each tensor: the [launch.abi] values of search_spaces/sm90.toml."""
    try:
        return {
            "q": int(params["q_box_rows"]),
            "k": int(params["kv_box_rows"]),
            "v": int(params["kv_box_rows"]),
            "o": int(params["o_box_rows"]),
        }
    except KeyError as e:
        raise TmaError(
            f"the space's [launch.abi] gives no {e.args[0]}; the sm90_tma ABI needs q_box_rows, "
            "kv_box_rows and o_box_rows"
        ) from None


@functools.cache
def encoder():
    """``cuTensorMapEncodeTiled`` of the CUDA driver (``CUresult (CUtensorMap*, CUtensorMapDataType,
    cuuint32_t rank, void* address, const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
    const cuuint32_t* element_strides, interleave, swizzle, l2_promotion, oob_fill)``)."""
    try:
        function = ctypes.CDLL(LIBCUDA).cuTensorMapEncodeTiled
    except (OSError, AttributeError) as e:
        raise TmaError(f"cannot find cuTensorMapEncodeTiled in the CUDA driver ({LIBCUDA}): {e}") from None
    p, u32, i = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int
    function.argtypes = [p, i, u32, p, p, p, p, p, i, i, i, i]
    function.restype = i
    return function


class TensorMapSlot:
    """The tensor map of one ``[batch, seqlen, heads, head_dim]`` 16-bit tensor at ``address`` (64-byte aligned,
    128 bytes, inside a buffer the caller keeps alive); :meth:`encode` fills it for a base address and strides."""

    def __init__(self, address: int, *, dtype: str, shape: tuple[int, int, int, int], rows_box: int) -> None:
        batch, seqlen, heads, head_dim = (int(x) for x in shape)
        if address % TMA_DESC_ALIGN:
            raise TmaError(f"a tensor map must be {TMA_DESC_ALIGN}-byte aligned")
        if dtype not in CU_TENSOR_MAP_DATA_TYPE:
            raise TmaError(f"tensor maps here describe fp16 or bf16 tensors, not {dtype!r}")
        if head_dim % _BOX_COLS:
            raise TmaError(f"head_dim {head_dim} must be a multiple of {_BOX_COLS}")
        if not 1 <= rows_box <= _MAX_BOX_ROWS:
            raise TmaError(f"box of {rows_box} rows is outside the TMA limit of 1..{_MAX_BOX_ROWS}")
        self.address = address
        self._dtype = CU_TENSOR_MAP_DATA_TYPE[dtype]
        self._dims = (ctypes.c_uint64 * 4)(head_dim, seqlen, heads, batch)
        self._strides = (ctypes.c_uint64 * 3)()
        self._box = (ctypes.c_uint32 * 4)(_BOX_COLS, rows_box, 1, 1)
        self._element_strides = (ctypes.c_uint32 * 4)(1, 1, 1, 1)
        self._view = (ctypes.c_char * TMA_DESC_BYTES).from_address(address)
        self._encode = encoder()
        self._remembered: dict[tuple[int, int, int, int], bytes] = {}
        self.shape = (batch, seqlen, heads, head_dim)
        self.rows_box = rows_box

    def encode(self, ptr: int, batch_stride: int, row_stride: int, head_stride: int) -> None:
        """Encode the map of the tensor at device address ``ptr`` with these strides (bytes)."""
        key = (ptr, batch_stride, row_stride, head_stride)
        known = self._remembered.get(key)
        if known is not None:
            self._view.raw = known
            return
        if ptr % 16 or any(s % 16 or not 0 < s < _MAX_STRIDE_BYTES for s in (row_stride, head_stride, batch_stride)):
            raise TmaError(
                f"a tensor map needs a 16-byte aligned base and strides that are positive multiples of 16 "
                f"below 2^40 bytes; got base % 16 = {ptr % 16}, strides (batch, row, head) "
                f"{(batch_stride, row_stride, head_stride)} B"
            )
        strides = self._strides
        strides[0], strides[1], strides[2] = row_stride, head_stride, batch_stride
        result = self._encode(
            self.address,
            self._dtype,
            4,
            ptr,
            ctypes.addressof(self._dims),
            ctypes.addressof(strides),
            ctypes.addressof(self._box),
            ctypes.addressof(self._element_strides),
            CU_TENSOR_MAP_INTERLEAVE_NONE,
            CU_TENSOR_MAP_SWIZZLE_128B,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
        if result != 0:
            raise TmaError(
                f"cuTensorMapEncodeTiled failed with CUresult {result} (shape {self.shape}, strides "
                f"(batch, row, head) {(batch_stride, row_stride, head_stride)} B, box rows {self.rows_box})"
            )
        if len(self._remembered) >= _REMEMBERED:
            self._remembered.clear()
        self._remembered[key] = self._view.raw
