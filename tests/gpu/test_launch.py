"""Kernel arguments (tuner/gpu/_launch.py, tuner/gpu/_tma.py) without a GPU: what ``cuLaunchKernel`` would read.

The argument-pointer array of each ABI is decoded and compared with kernel_src/README.md's
signatures. For ``sm90_tma``, ``cuTensorMapEncodeTiled`` is a stand-in compiled here against
the CUDA toolkit's ``cuda.h`` (so the ctypes prototype and the enum values are checked against
the real declarations); it writes the arguments it received into the 128-byte map.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import shutil
import struct
import subprocess
import types
from pathlib import Path

import pytest

pytest.importorskip("cupy", reason="tuner.gpu needs CuPy installed (not a GPU)")

from tuner.gpu import _launch as launch
from tuner.gpu import _tma as tma
from tuner.gpu._launch import FlatArgs, TmaArgs
from tuner.problem import Problem

SHAPE = Problem(batch=3, seqlen_q=1000, seqlen_k=777, heads_q=8, heads_kv=2, head_dim=128, dtype="bf16")
# (pointer, batch stride, row stride, head stride) in elements
Q = (0x7F0000001000, 8 * 128 * 1000, 8 * 128, 128)
K = (0x7F0000200000, 2 * 128 * 777, 2 * 128, 128)
V = (0x7F0000400000, 2 * 128 * 777 + 64, 2 * 128 + 8, 136)
O = (0x7F0000600000, 8 * 128 * 1000, 8 * 128, 128)
LSE = 0x7F0000800000
_ZEROED_DEVICE_MEMORY = launch._zeroed_device_memory  # before any test replaces it


def params(buffer: launch.ArgBuffer, formats: list[str]) -> list:
    """Each argument as the kernel reads it: argument i is ``formats[i]`` at pointer i of the array."""
    return [struct.unpack("=" + f, buffer.param_bytes(i, struct.calcsize("=" + f)))[0] for i, f in enumerate(formats)]


def test_flat_arguments_follow_the_abi():
    args = FlatArgs(SHAPE, {})
    args.pack(Q, K, V, O, LSE, 0.125)
    got = params(args.buffer, ["Q"] * 5 + ["i"] * 5 + ["q"] * 12 + ["f"])
    assert got[:5] == [Q[0], K[0], V[0], O[0], LSE]
    assert got[5:10] == [3, 1000, 777, 8, 2]  # batch, seqlen_q, seqlen_k, heads_q, heads_kv
    assert got[10:22] == [*Q[1:], *K[1:], *V[1:], *O[1:]]  # batch, row, head stride of q, k, v, o
    assert got[22] == 0.125
    args.pack(K, Q, O, V, LSE + 64, 2.0)  # refilled in place for the next launch
    again = params(args.buffer, ["Q"] * 5 + ["i"] * 5 + ["q"] * 12 + ["f"])
    assert again[:5] == [K[0], Q[0], O[0], V[0], LSE + 64] and again[10:13] == list(K[1:]) and again[22] == 2.0


def test_argument_buffer_aligns_tensor_maps_and_scalars():
    buffer = launch.ArgBuffer(lead_params=4, scalars="P5if")
    pointers = (ctypes.c_void_p * 11).from_address(buffer.params_address)
    assert [p % 64 for p in pointers[:4]] == [0] * 4 and pointers[1] - pointers[0] == 128
    assert pointers[4] == pointers[0] + 512 and pointers[4] % 8 == 0
    assert [pointers[5 + i] - pointers[4] for i in range(6)] == [8, 12, 16, 20, 24, 28]


# -- sm90_tma with a stand-in driver ---------------------------------------------------------------
FAKE_DRIVER = r"""
#include <cuda.h>
#include <string.h>

static int calls = 0;
int fake_calls(void) { return calls; }

/* The real declaration comes from cuda.h: a prototype that differs from it does not compile. */
CUresult CUDAAPI cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType dtype, cuuint32_t rank, void* address,
                                        const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                        const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                        CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                        CUtensorMapFloatOOBfill oob) {
  unsigned long long words[16];
  ++calls;
  if (rank != 4) return CUDA_ERROR_INVALID_VALUE;
  if (interleave != CU_TENSOR_MAP_INTERLEAVE_NONE || swizzle != CU_TENSOR_MAP_SWIZZLE_128B ||
      l2 != CU_TENSOR_MAP_L2_PROMOTION_L2_256B || oob != CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    return CUDA_ERROR_INVALID_VALUE;
  if (dtype == CU_TENSOR_MAP_DATA_TYPE_FLOAT16) words[0] = 16;
  else if (dtype == CU_TENSOR_MAP_DATA_TYPE_BFLOAT16) words[0] = 1616;
  else return CUDA_ERROR_INVALID_VALUE;
  words[1] = (unsigned long long)address;
  for (int i = 0; i < 4; ++i) words[2 + i] = dims[i];
  for (int i = 0; i < 3; ++i) words[6 + i] = strides[i];
  for (int i = 0; i < 4; ++i) words[9 + i] = box[i];
  words[13] = element_strides[0] + element_strides[1] + element_strides[2] + element_strides[3];
  words[14] = 0xF1A5u;
  words[15] = (unsigned long long)calls;
  memcpy(map, words, sizeof(words));
  return CUDA_SUCCESS;
}
"""


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory) -> Path:
    nvcc = shutil.which("nvcc")
    compiler = shutil.which("cc") or shutil.which("gcc")
    if nvcc is None or compiler is None:
        pytest.skip("needs nvcc (for cuda.h) and a C compiler")
    candidates = [Path(nvcc).resolve().parent.parent / "include", Path("/usr/local/cuda/include")]
    candidates += [Path(os.environ[v]) / "include" for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    include = next((c for c in candidates if (c / "cuda.h").is_file()), None)
    if include is None:
        pytest.skip(f"no cuda.h in {', '.join(map(str, candidates))}")
    folder = tmp_path_factory.mktemp("fake-driver")
    (folder / "driver.c").write_text(FAKE_DRIVER)
    library = folder / "libfakecuda.so"
    build = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", "-I", str(include), str(folder / "driver.c"), "-o", str(library)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    return library


@pytest.fixture
def stand_in_driver(fake_driver, monkeypatch):
    monkeypatch.setattr(tma, "LIBCUDA", str(fake_driver))
    tma.encoder.cache_clear()
    yield ctypes.CDLL(str(fake_driver))
    tma.encoder.cache_clear()


def decode_map(raw: bytes) -> dict:
    words = struct.unpack("=16Q", raw)
    assert words[14] == 0xF1A5, "the stand-in driver did not write this map"
    return {
        "dtype": {16: "fp16", 1616: "bf16"}[words[0]],
        "address": words[1],
        "dims": words[2:6],
        "strides": words[6:9],
        "box": words[9:13],
        "element_strides": words[13],
        "call": words[15],
    }


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_tensor_maps_follow_the_abi(stand_in_driver, dtype):
    shape = dataclasses.replace(SHAPE, dtype=dtype)
    args = TmaArgs(shape, {"q_box_rows": 128, "kv_box_rows": 64, "o_box_rows": 64})
    args.pack(Q, K, V, O, LSE, 0.5)
    maps = [decode_map(args.buffer.param_bytes(i, 128)) for i in range(4)]
    for m, (ptr, batch, row, head), rows, seqlen, heads in zip(
        maps, (Q, K, V, O), (128, 64, 64, 64), (1000, 777, 777, 1000), (8, 2, 2, 8)
    ):
        assert m["dtype"] == dtype and m["address"] == ptr
        assert m["dims"] == (128, seqlen, heads, 3)  # innermost first: head_dim, seqlen, heads, batch
        assert m["strides"] == (2 * row, 2 * head, 2 * batch)  # bytes: row, head, batch
        assert m["box"] == (64, rows, 1, 1) and m["element_strides"] == 4
    tail = params(args.buffer, ["128s"] * 4 + ["Q", "i", "i", "i", "i", "i", "f"])[4:]
    assert tail == [LSE, 3, 1000, 777, 8, 2, 0.5]


def test_tensor_maps_are_remembered_per_address_and_strides(stand_in_driver):
    args = TmaArgs(SHAPE, {"q_box_rows": 64, "kv_box_rows": 64, "o_box_rows": 64})
    calls = stand_in_driver.fake_calls
    before = calls()
    args.pack(Q, K, V, O, LSE, 1.0)
    assert calls() == before + 4
    args.pack(Q, K, V, O, LSE, 1.0)  # the same buffers again: no driver call
    assert calls() == before + 4
    moved = (O[0] + 4096, *O[1:])
    args.pack(Q, K, V, moved, LSE, 1.0)
    assert calls() == before + 5
    assert decode_map(args.buffer.param_bytes(3, 128))["address"] == moved[0]
    args.pack(Q, K, V, O, LSE, 1.0)  # back to the first O: its remembered bytes, not the last encoding
    assert calls() == before + 5 and decode_map(args.buffer.param_bytes(3, 128))["address"] == O[0]


def test_tensors_a_map_cannot_describe_are_refused(stand_in_driver):
    args = TmaArgs(SHAPE, {"q_box_rows": 64, "kv_box_rows": 64, "o_box_rows": 64})
    with pytest.raises(tma.TmaError, match="16-byte aligned"):
        args.pack((Q[0] + 2, *Q[1:]), K, V, O, LSE, 1.0)
    with pytest.raises(tma.TmaError, match="positive multiples of 16"):
        args.pack(Q, (K[0], K[1], 0, K[3]), V, O, LSE, 1.0)
    with pytest.raises(tma.TmaError, match="multiple of 64"):
        TmaArgs(dataclasses.replace(SHAPE, head_dim=96), {"q_box_rows": 64, "kv_box_rows": 64, "o_box_rows": 64})
    with pytest.raises(tma.TmaError, match="TMA limit"):
        TmaArgs(SHAPE, {"q_box_rows": 512, "kv_box_rows": 64, "o_box_rows": 64})
    with pytest.raises(tma.TmaError, match="gives no kv_box_rows"):
        TmaArgs(SHAPE, {"q_box_rows": 64, "o_box_rows": 64})


def test_a_missing_driver_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(tma, "LIBCUDA", str(tmp_path / "libnothing.so"))
    tma.encoder.cache_clear()
    try:
        with pytest.raises(tma.TmaError, match="cannot find cuTensorMapEncodeTiled"):
            TmaArgs(SHAPE, {"q_box_rows": 64, "kv_box_rows": 64, "o_box_rows": 64})
    finally:
        tma.encoder.cache_clear()


# -- sm90_tma_sched: the tile counters ----------------------------------------------------------------
def _fake_device_memory(monkeypatch, *, with_reason: bool = False) -> list[tuple]:
    """Device allocations of the launch layer replaced by a fake range on device 0; returns the list they are
    recorded in, (bytes, stream) each, and the reason given with ``with_reason``."""
    allocations: list[tuple] = []

    def allocate(nbytes, stream, why=None):
        allocations.append((nbytes, stream, why) if with_reason else (nbytes, stream))
        return 0x10000000 * len(allocations)

    monkeypatch.setattr(launch, "_zeroed_device_memory", allocate)
    monkeypatch.setattr(launch, "_current_device", lambda: 0)
    return allocations


@pytest.fixture
def counters(monkeypatch):
    """A fresh TileCounters whose device memory is a fake range (the allocations are recorded: bytes, stream)."""
    allocations = _fake_device_memory(monkeypatch)
    fresh = launch.TileCounters()
    monkeypatch.setattr(launch, "TILE_COUNTERS", fresh)
    return fresh, allocations


def test_every_stream_of_a_device_gets_its_own_counter(counters):
    tiles, allocations = counters
    a, b = tiles.get(0, 0x1111), tiles.get(0, 0x2222)
    assert a != b and tiles.get(0, 0x1111) == a and tiles.get(0, 0x2222) == b
    assert tiles.get(1, 0x1111) not in (a, b)  # the same handle on another device
    assert [n for n, _ in allocations] == [8 * launch._TILE_COUNTERS_PER_SLAB] * 2  # one slab per device
    assert {a, b} <= set(range(0x10000000, 0x10000000 + allocations[0][0], 8)) and a % 8 == b % 8 == 0


def test_the_per_thread_stream_gets_a_counter_per_thread(counters):
    import threading

    tiles, _ = counters
    here = tiles.get(0, launch._PER_THREAD_STREAM)
    there = []
    thread = threading.Thread(target=lambda: there.append(tiles.get(0, launch._PER_THREAD_STREAM)))
    thread.start()
    thread.join()
    assert there[0] != here and tiles.get(0, launch._PER_THREAD_STREAM) == here


def test_a_full_slab_is_followed_by_another(counters):
    tiles, allocations = counters
    tiles.reserve(0)
    assert len(allocations) == 1 and allocations[0][1] is None
    taken = {tiles.get(0, s) for s in range(1, launch._TILE_COUNTERS_PER_SLAB + 2)}
    assert len(taken) == launch._TILE_COUNTERS_PER_SLAB + 1
    assert [s for _, s in allocations] == [None, launch._TILE_COUNTERS_PER_SLAB + 1]  # the stream that found none


def test_no_counter_is_allocated_during_a_capture(monkeypatch):
    """A new slab while the stream captures a CUDA graph is refused with what to do (reached only when every
    counter of the reserved slab is taken)."""
    monkeypatch.setattr(
        launch.cupy.cuda, "ExternalStream", lambda handle: types.SimpleNamespace(is_capturing=lambda: True)
    )
    with pytest.raises(launch.LaunchError, match="launch the kernel once on this stream before capturing"):
        launch._zeroed_device_memory(8, 0x1234)


def test_each_launch_passes_its_streams_counter(counters, monkeypatch, stand_in_driver):
    tiles, _ = counters
    seen = []

    def record(function_ptr, grid, threads, smem_bytes, stream, params_address):
        pointers = (ctypes.c_void_p * 12).from_address(params_address)
        seen.append((stream, struct.unpack("=Q", ctypes.string_at(pointers[11], 8))[0]))

    monkeypatch.setattr(launch, "launch_kernel", record)
    boxes = {"q_box_rows": 128, "kv_box_rows": 64, "o_box_rows": 64}
    for tile_counter in (1, 0):
        kernel = launch.Kernel(
            types.SimpleNamespace(ptr=0xF00D),
            abi="sm90_tma_sched",
            grid=(132, 1, 1),
            threads=384,
            smem_bytes=1024,
            config={},
            abi_params={**boxes, "tile_counter": tile_counter},
        )
        launcher = kernel.launcher(SHAPE)
        for stream in (0x1111, 0x2222, 0x1111):
            launcher(stream, Q, K, V, O, LSE, 1.0)
    expected = [(s, tiles.get(0, s)) for s in (0x1111, 0x2222, 0x1111)] + [(s, 0) for s in (0x1111, 0x2222, 0x1111)]
    assert seen == expected and expected[0][1] != expected[1][1]


# -- sm90_tma_sched: split-KV's workspaces ------------------------------------------------------------
@pytest.fixture
def workspaces(monkeypatch):
    """A fresh SplitWorkspaces whose device memory is a fake range (each allocation: (bytes, stream, why))."""
    allocations = _fake_device_memory(monkeypatch, with_reason=True)
    fresh = launch.SplitWorkspaces()
    monkeypatch.setattr(launch, "SPLIT_WORKSPACES", fresh)
    return fresh, allocations


def test_every_stream_of_a_device_gets_its_own_workspace(workspaces):
    ws, allocations = workspaces
    a, b = ws.get(0, 0x1111, 64, 4096), ws.get(0, 0x2222, 64, 4096)
    assert a != b and ws.get(0, 0x1111, 64, 4096) == a and ws.get(0, 0x2222, 32, 1024) == b  # smaller: the same
    assert ws.get(1, 0x1111, 64, 4096) not in (a, b)  # the same handle on another device
    assert len(allocations) == 3
    counters, partials = a
    assert partials - counters == launch._SPLIT_ALIGN  # 64 B of counters rounded up; the partials follow
    assert allocations[0][0] == launch._SPLIT_ALIGN + 4096


def test_a_larger_problem_gets_a_new_workspace_and_the_old_one_is_kept(workspaces):
    """A stream's workspace grows (at least doubling) when a larger problem comes; the outgrown one is never given
    to another stream (a kernel queued on the first may still use it). More counters than the workspace holds take
    a new one even where the bytes would fit: its counters are never some other problem's partials."""
    ws, allocations = workspaces
    small = ws.get(0, 0x1111, 256, 1 << 20)
    large = ws.get(0, 0x1111, 256, 3 << 20)
    assert large != small and allocations[-1][0] == 256 + (3 << 20)
    assert ws.get(0, 0x1111, 256, 5 << 20) != large and allocations[-1][0] == 256 + (6 << 20)  # doubled
    more_counters = ws.get(0, 0x1111, 1024, 1024)
    assert allocations[-1][0] == 1024 + (6 << 20)
    other = ws.get(0, 0x2222, 256, 1 << 20)
    assert other not in (small, large, more_counters) and len(allocations) == 5
    assert "smaller than the kernel needs" in allocations[1][2]


def test_a_reserved_workspace_serves_a_streams_first_launch_in_a_capture(workspaces, monkeypatch):
    """Loading a kernel reserves a spare workspace outside any capture; a stream that first launches inside a capture
    takes it without allocating; a second such stream finds none and is refused with what to do."""
    ws, allocations = workspaces
    ws.reserve(0, 256, 8192)
    ws.reserve(0, 128, 4096)  # the spare fits: nothing more
    assert [(n, s) for n, s, _ in allocations] == [(256 + 8192, None)]
    monkeypatch.setattr(
        launch.cupy.cuda, "ExternalStream", lambda handle: types.SimpleNamespace(is_capturing=lambda: True)
    )
    assert ws.get(0, 0x1111, 256, 8192) == (0x10000000, 0x10000000 + 256)
    monkeypatch.setattr(launch, "_zeroed_device_memory", _ZEROED_DEVICE_MEMORY)  # the real one: refuses in a capture
    with pytest.raises(launch.LaunchError, match=r"workspace \(none\) is smaller .* before capturing"):
        ws.get(0, 0x2222, 256, 8192)


def test_each_launch_passes_its_streams_workspace(workspaces, monkeypatch, stand_in_driver):
    """kv_splits > 1 ([launch.abi] split_counter_bytes > 0): the last two arguments are the stream's counters and
    partials, at every launch, by a Launcher and by Kernel.launch; kv_splits = 1: both null and nothing allocated."""
    ws, allocations = workspaces
    seen = []

    def record(function_ptr, grid, threads, smem_bytes, stream, params_address):
        pointers = (ctypes.c_void_p * 14).from_address(params_address)
        seen.append((stream, *(struct.unpack("=Q", ctypes.string_at(pointers[i], 8))[0] for i in (12, 13))))

    monkeypatch.setattr(launch, "launch_kernel", record)
    boxes = {"q_box_rows": 128, "kv_box_rows": 64, "o_box_rows": 64, "tile_counter": 0}
    for counter_bytes, partial_bytes in ((96, 8192), (0, 0)):
        kernel = launch.Kernel(
            types.SimpleNamespace(ptr=0xF00D),
            abi="sm90_tma_sched",
            grid=(132, 1, 1),
            threads=384,
            smem_bytes=1024,
            config={},
            abi_params={**boxes, "split_counter_bytes": counter_bytes, "split_partial_bytes": partial_bytes},
        )
        launcher = kernel.launcher(SHAPE)
        for stream in (0x1111, 0x2222, 0x1111):
            launcher(stream, Q, K, V, O, LSE, 1.0)
        args = launch.TmaSchedArgs(SHAPE, kernel.abi_params)  # what Kernel.args builds from arrays
        args.pack(Q, K, V, O, LSE, 1.0)
        kernel.launch(args, 0x2222)
    assert len(allocations) == 2  # the spare the first kernel reserved (taken by 0x1111), then 0x2222's
    streams = (0x1111, 0x2222, 0x1111, 0x2222)
    expected = [(s, *ws.get(0, s, 96, 8192)) for s in streams] + [(s, 0, 0) for s in streams]
    assert seen == expected and expected[0][1:] != expected[1][1:]


def test_kernels_of_the_other_abis_launch_without_a_workspace(workspaces, monkeypatch, stand_in_driver):
    """flat and sm90_tma have neither a tile counter nor a workspace: their launches allocate nothing."""
    _, allocations = workspaces
    launched = []
    monkeypatch.setattr(launch, "launch_kernel", lambda *a: launched.append(a[4]))
    for abi, params in (("flat", {}), ("sm90_tma", {"q_box_rows": 128, "kv_box_rows": 64, "o_box_rows": 64})):
        kernel = launch.Kernel(
            types.SimpleNamespace(ptr=0xF00D),
            abi=abi,
            grid=(1, 1, 1),
            threads=128,
            smem_bytes=0,
            config={},
            abi_params=params,
        )
        kernel.launcher(SHAPE)(0x1111, Q, K, V, O, LSE, 1.0)
        args = launch.ABIS[abi](SHAPE, params)
        args.pack(Q, K, V, O, LSE, 1.0)
        kernel.launch(args, 0x1111)
    assert launched == [0x1111] * 4 and allocations == []
