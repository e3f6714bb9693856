"""A stand-in for the GPU under ``tuner.attention``'s cached path (tests/serve/test_attention.py, test_tuned.py).

PyTorch CPU tensors count as tensors of CUDA device 0; the device is a B200 for the ``flat``
ABI (family sm80: sm_90a code does not run there, so ``family="auto"`` picks sm80) and an H200
for ``sm90_tma`` and ``sm90_tma_sched`` (nominal tables); the compiled kernel function is a fake handle; ``cuLaunchKernel``
records what it was asked to launch and decodes the arguments of the stand-in's ABI; device memory for tile counters
is a fake address range.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import struct
import types
from typing import ClassVar

from tuner.devices import limits_for_arch
from tuner.gpu import _launch as launch

ta = importlib.import_module("tuner.serve._attention")


def fake_tensor_map_encoder(address, dtype, rank, ptr, dims, strides, box, element_strides, *flags) -> int:
    """A stand-in for cuTensorMapEncodeTiled (called with plain ints): writes (dtype, ptr, dims, byte strides,
    box) into the 128-byte map."""
    words = [
        dtype,
        ptr,
        *(ctypes.c_uint64 * 4).from_address(dims),
        *(ctypes.c_uint64 * 3).from_address(strides),
        *(ctypes.c_uint32 * 4).from_address(box),
    ]
    ctypes.memmove(address, struct.pack("=13Q", *words) + bytes(128 - 13 * 8), 128)
    return 0


H200 = limits_for_arch(90)
B200 = limits_for_arch(100)


class StandInGPU:
    """Records each launch: function, geometry, stream, and the arguments decoded for ``abi``."""

    #: the arguments each ABI's kernel reads (struct formats; a tensor map is 128 bytes)
    FORMATS: ClassVar[dict[str, list[str]]] = {
        "flat": ["Q"] * 5 + ["i"] * 5 + ["q"] * 12 + ["f"],
        "sm90_tma": ["128s"] * 4 + ["Q"] + ["i"] * 5 + ["f"],
        "sm90_tma_sched": ["128s"] * 4 + ["Q"] + ["i"] * 5 + ["f"] + ["Q"] * 3,
    }

    def __init__(self, abi: str = "flat", device=None) -> None:
        self.abi = abi
        self.device = device if device is not None else (B200 if abi == "flat" else H200)
        self.launches: list[dict] = []
        self.loaded: list[dict] = []
        self.allocations: list[int] = []  # bytes of each zeroed device allocation (tile counters, workspaces)

    def zeroed_device_memory(self, nbytes: int, stream, why=None) -> int:
        self.allocations.append(nbytes)
        return 0xC0DE0000 + 0x100000 * len(self.allocations)

    def load_function(self, space, config, problem, device, device_id):
        self.loaded.append({"family": space.name, "config": dict(config), "problem": problem})
        return types.SimpleNamespace(ptr=0xF00D + len(self.loaded))

    def launch_kernel(self, function_ptr, grid, threads, smem_bytes, stream, params_address):
        formats = self.FORMATS[self.abi]
        pointers = (ctypes.c_void_p * len(formats)).from_address(params_address)
        args = [
            struct.unpack("=" + f, ctypes.string_at(pointers[i], struct.calcsize("=" + f)))[0]
            for i, f in enumerate(formats)
        ]
        self.launches.append(
            {
                "function": function_ptr,
                "grid": grid,
                "threads": threads,
                "smem_bytes": smem_bytes,
                "stream": stream,
                "args": args,
            }
        )

    @property
    def last(self) -> dict:
        return self.launches[-1]


def install(monkeypatch, stand_in: StandInGPU) -> None:
    """Put ``stand_in`` under tuner.attention for the rest of the test (and start with an empty plan cache)."""
    ta.clear_cache()
    monkeypatch.setattr(ta, "_torch_device", lambda t: 0)
    monkeypatch.setattr(ta, "_torch_stream", lambda torch, device: 0x5EA)
    monkeypatch.setattr(ta, "_torch_capturing", lambda torch: False)
    monkeypatch.setattr(ta, "_device_limits", lambda device_id: stand_in.device)
    monkeypatch.setattr(ta, "_load_function", stand_in.load_function)
    monkeypatch.setattr(ta, "_select_device", lambda device_id: contextlib.nullcontext())
    monkeypatch.setattr(ta, "_current_context", lambda: 0xC0)
    monkeypatch.setattr(launch, "launch_kernel", stand_in.launch_kernel)
    monkeypatch.setattr(launch, "driver", types.SimpleNamespace(funcSetAttribute=lambda *a: None))
    monkeypatch.setattr(launch, "_current_device", lambda: 0)
    monkeypatch.setattr(launch, "_zeroed_device_memory", stand_in.zeroed_device_memory)
    monkeypatch.setattr(launch, "TILE_COUNTERS", launch.TileCounters())
    monkeypatch.setattr(launch, "SPLIT_WORKSPACES", launch.SplitWorkspaces())
