"""Load a cubin and launch a flashtune kernel on CuPy arrays. GPU-only (imports CuPy)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import cupy
import numpy as np

__all__ = ["Kernel", "load_kernel", "ABIS"]

_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CUfunction_attribute CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES


def _flat_args(q, k, v, o, lse, *, softmax_scale: float, params: Mapping[str, int]) -> tuple:
    """Arguments of ABI ``flat`` (kernel_src/README.md): pointers, sizes, element strides, scale."""
    batch, seqlen_q, heads_q, _ = q.shape
    _, seqlen_k, heads_kv, _ = k.shape
    args: list[object] = [q, k, v, o, lse]
    args += [np.int32(batch), np.int32(seqlen_q), np.int32(seqlen_k), np.int32(heads_q), np.int32(heads_kv)]
    for t in (q, k, v, o):
        args += [np.int64(s // t.itemsize) for s in t.strides[:3]]
    args.append(np.float32(softmax_scale))
    return tuple(args)


def _sm90_tma_args(q, k, v, o, lse, *, softmax_scale: float, params: Mapping[str, int]) -> tuple:
    from .tma import build_args  # the Hopper family's tensor maps

    return build_args(q, k, v, o, lse, softmax_scale=softmax_scale, params=params)


#: ABI name (a space file's ``[family] abi``) -> argument builder
ABIS: dict[str, Callable[..., tuple]] = {"flat": _flat_args, "sm90_tma": _sm90_tma_args}


class Kernel:
    """One loaded kernel with its launch geometry."""

    def __init__(self, function, *, abi: str, grid: tuple[int, int, int], threads: int, smem_bytes: int,
                 config: Mapping[str, int], abi_params: Mapping[str, int] | None = None) -> None:
        if abi not in ABIS:
            raise ValueError(f"unknown kernel ABI {abi!r}; known: {', '.join(ABIS)}")
        self.function = function
        self.build_args = ABIS[abi]
        self.grid, self.threads, self.smem_bytes = grid, threads, smem_bytes
        self.config = dict(config)
        self.abi_params = dict(abi_params or {})  # the space's [launch.abi] values for this config and shape
        if smem_bytes > 48 * 1024:  # opt in to more than the default 48 KB of dynamic shared memory
            cupy.cuda.driver.funcSetAttribute(function.ptr, _MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes)

    def args(self, q, k, v, o, lse, softmax_scale: float) -> tuple:
        return self.build_args(q, k, v, o, lse, softmax_scale=softmax_scale, params=self.abi_params)

    def launch(self, args: tuple, stream=None) -> None:
        self.function(self.grid, (self.threads, 1, 1), args, shared_mem=self.smem_bytes, stream=stream)


@functools.lru_cache(maxsize=64)
def _module(cubin_path: str):
    module = cupy.cuda.function.Module()
    module.load_file(cubin_path)
    return module


def load_kernel(cubin_path: str, entry: str, *, abi: str, grid: tuple[int, int, int], threads: int,
                smem_bytes: int, config: Mapping[str, int], abi_params: Mapping[str, int] | None = None) -> Kernel:
    return Kernel(_module(cubin_path).get_function(entry), abi=abi, grid=tuple(grid), threads=threads,
                  smem_bytes=smem_bytes, config=config, abi_params=abi_params)
