"""The kernel ABIs, described once: each entry's parameters in order, with their C types and how the host
lays them out. ``tuner/gpu/_launch.py`` builds its argument buffers from these descriptions;
tests/kernels/test_abi_contract.py holds every kernel's ``extern "C"`` declaration (in kernel_src/ and in
examples/) and the declarations written in kernel_src/README.md to them. No CuPy here.

A parameter's ``code`` is its :mod:`struct` format character in the host buffer: ``P`` a device pointer,
``i`` a C ``int``, ``q`` a ``long long``, ``f`` a ``float``; ``tensor_map`` marks a 128-byte, 64-byte-aligned
``CUtensorMap`` passed by value (``const __grid_constant__``), which the buffer holds ahead of the scalars.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ABI_PARAMS", "AbiParam", "c_parameters", "scalar_format", "tensor_map_count"]


@dataclass(frozen=True)
class AbiParam:
    name: str
    c_type: str  # as the kernel declares it, without __restrict__ (elem_t: __half or __nv_bfloat16)
    code: str  # struct format character, or "" for a tensor map


def _strides(*tensors: str) -> tuple[AbiParam, ...]:
    return tuple(AbiParam(f"{t}_{axis}_stride", "long long", "q") for t in tensors for axis in ("batch", "row", "head"))


_SIZES = tuple(AbiParam(n, "int", "i") for n in ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv"))
_SCALE = AbiParam("softmax_scale", "float", "f")
_SM90_TMA = (
    *(AbiParam(f"tma_{t}", "CUtensorMap", "") for t in ("q", "k", "v", "o")),
    AbiParam("lse", "float*", "P"),
    *_SIZES,
    _SCALE,
)

#: ABI name (a space file's ``[family] abi``) -> the entry's parameters, in order
ABI_PARAMS: dict[str, tuple[AbiParam, ...]] = {
    "flat": (
        AbiParam("q", "const elem_t*", "P"),
        AbiParam("k", "const elem_t*", "P"),
        AbiParam("v", "const elem_t*", "P"),
        AbiParam("o", "elem_t*", "P"),
        AbiParam("lse", "float*", "P"),
        *_SIZES,
        *_strides("q", "k", "v", "o"),
        _SCALE,
    ),
    "sm90_tma": _SM90_TMA,
    # sm90_tma and the dynamic tile scheduler's counter: two zeroed uint32 words per stream (null when the
    # config's [launch.abi] tile_counter is 0); then split-KV's zeroed counters and fp32 partials (null when
    # [launch.abi] split_counter_bytes is 0)
    "sm90_tma_sched": (
        *_SM90_TMA,
        AbiParam("tile_counter", "unsigned int*", "P"),
        AbiParam("split_counters", "unsigned int*", "P"),
        AbiParam("split_partials", "float*", "P"),
    ),
}


def tensor_map_count(abi: str) -> int:
    """How many tensor maps lead the ABI's parameters (they must all come first)."""
    params = ABI_PARAMS[abi]
    count = sum(1 for p in params if not p.code)
    assert all(not p.code for p in params[:count]), f"{abi}: tensor maps must lead the parameters"
    return count


def scalar_format(abi: str) -> str:
    """The :mod:`struct` format of the parameters after the tensor maps, e.g. ``"PPPPPiiiiiqqqqqqqqqqqqf"``."""
    return "".join(p.code for p in ABI_PARAMS[abi][tensor_map_count(abi) :])


def c_parameters(abi: str) -> list[tuple[str, str]]:
    """(C type, name) of each parameter, as a kernel declares it (a tensor map as
    ``const __grid_constant__ CUtensorMap``)."""
    return [("const __grid_constant__ CUtensorMap" if not p.code else p.c_type, p.name) for p in ABI_PARAMS[abi]]
