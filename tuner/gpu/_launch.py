"""Load a cubin and launch a flashtune kernel. GPU-only (imports CuPy).

The kernel arguments of each ABI (kernel_src/README.md) are laid out once in a host buffer
with the array of pointers ``cuLaunchKernel`` takes (:class:`ArgBuffer`); a launch only writes
the values that change (device pointers, strides, the scale, and for ``sm90_tma`` the tensor
maps) and calls the driver on a stream. The driver copies the arguments when the launch is
made (or captured into a CUDA graph), so a buffer can be refilled for the next launch. ABI
``sm90_tma_sched`` adds the dynamic tile scheduler's counter, one per (device, stream)
(:class:`TileCounters`), and split-KV's workspace, one per (device, stream) grown to the largest problem
(:class:`SplitWorkspaces`), both filled in at each launch for the stream it runs on.

Operands are ``(pointer, batch_stride, row_stride, head_stride)`` of a
``[batch, seqlen, heads, head_dim]`` tensor, strides in elements, the last dimension contiguous.
"""

from __future__ import annotations

import ctypes
import functools
import struct
import threading
from collections.abc import Mapping

import cupy
from cupy.cuda import driver

from ..problem import DTYPES, Problem
from ._abi import ABI_PARAMS, scalar_format, tensor_map_count
from ._tma import TMA_DESC_ALIGN, TMA_DESC_BYTES, TensorMapSlot, box_rows

__all__ = [
    "ABIS",
    "SPLIT_WORKSPACES",
    "TILE_COUNTERS",
    "ArgBuffer",
    "Kernel",
    "LaunchError",
    "Launcher",
    "Operand",
    "SplitWorkspaces",
    "TileCounters",
    "load_kernel",
    "uses_tile_counter",
]

_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CUfunction_attribute CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES

Operand = tuple[int, int, int, int]  # (device pointer, batch stride, row stride, head stride), strides in elements

#: the storage dtype of an operand's elements -> its dtype's name (bf16 is held as uint16 bits)
_DTYPE_OF_STORAGE = {d.storage: name for name, d in DTYPES.items()}


class LaunchError(ValueError):
    """Arrays that do not fit a kernel's arguments (shapes, dtypes, layout)."""


def launch_kernel(
    function_ptr: int, grid: tuple[int, int, int], threads: int, smem_bytes: int, stream: int, params_address: int
) -> None:
    """``cuLaunchKernel`` with an argument-pointer array (raises CuPy's CUDADriverError on failure)."""
    driver.launchKernel(function_ptr, grid[0], grid[1], grid[2], threads, 1, 1, smem_bytes, stream, params_address, 0)


class ArgBuffer:
    """Kernel arguments in one host buffer: a 64-byte-aligned block of ``lead_bytes`` (tensor maps), then scalars
    laid out as the native ``struct`` format ``scalars``; ``params_address`` is the argument-pointer array."""

    def __init__(self, *, lead_params: int, scalars: str) -> None:
        self.scalars = struct.Struct("@" + scalars)
        self.lead_bytes = lead_params * TMA_DESC_BYTES
        size = self.lead_bytes + self.scalars.size
        self._storage = ctypes.create_string_buffer(size + TMA_DESC_ALIGN)
        start = ctypes.addressof(self._storage)
        self.offset = -start % TMA_DESC_ALIGN
        self.address = start + self.offset
        pointers = [self.address + i * TMA_DESC_BYTES for i in range(lead_params)]
        position = 0
        for code in _codes(scalars):
            size_of = struct.calcsize("@" + code)
            position += -position % size_of  # native alignment, as struct lays it out
            pointers.append(self.address + self.lead_bytes + position)
            position += size_of
        assert position == self.scalars.size, (scalars, position, self.scalars.size)
        self._pointers = (ctypes.c_void_p * len(pointers))(*pointers)
        self.params_address = ctypes.addressof(self._pointers)

    def pack_scalars(self, *values) -> None:
        self.scalars.pack_into(self._storage, self.offset + self.lead_bytes, *values)

    def param_bytes(self, index: int, size: int) -> bytes:
        """The ``size`` bytes argument ``index`` points at (for tests)."""
        return ctypes.string_at(self._pointers[index], size)

    def param_address(self, index: int) -> int:
        """Where argument ``index`` lives in the buffer."""
        return self._pointers[index]


def _codes(fmt: str) -> list[str]:
    out, count = [], ""
    for ch in fmt:
        if ch.isdigit():
            count += ch
        else:
            out += [ch] * int(count or 1)
            count = ""
    return out


class FlatArgs:
    """ABI ``flat`` (family sm80): pointers, sizes, element strides of Q, K, V, O, scale (``_abi.ABI_PARAMS``,
    whose order :meth:`pack` follows)."""

    abi = "flat"
    uses_tile_counter = False  # whether the kernel reads a tile counter (TmaSchedArgs)
    split_workspace: tuple[int, int] | None = None  # (counter, partial) bytes of a split-KV kernel (TmaSchedArgs)

    def __init__(self, problem: Problem, params: Mapping[str, int]) -> None:
        self.buffer = ArgBuffer(lead_params=tensor_map_count(self.abi), scalars=scalar_format(self.abi))
        self._sizes = (problem.batch, problem.seqlen_q, problem.seqlen_k, problem.heads_q, problem.heads_kv)

    def pack(self, q: Operand, k: Operand, v: Operand, o: Operand, lse: int, softmax_scale: float) -> None:
        self.buffer.pack_scalars(
            q[0],
            k[0],
            v[0],
            o[0],
            lse,
            *self._sizes,
            q[1],
            q[2],
            q[3],
            k[1],
            k[2],
            k[3],
            v[1],
            v[2],
            v[3],
            o[1],
            o[2],
            o[3],
            softmax_scale,
        )


class TmaArgs:
    """ABI ``sm90_tma`` (family sm90): tensor maps of Q, K, V, O, then the LSE pointer, sizes and scale
    (``_abi.ABI_PARAMS``, whose order :meth:`pack` follows)."""

    abi = "sm90_tma"
    uses_tile_counter = False
    split_workspace: tuple[int, int] | None = None

    def __init__(self, problem: Problem, params: Mapping[str, int]) -> None:
        self.buffer = ArgBuffer(lead_params=tensor_map_count(self.abi), scalars=scalar_format(self.abi))
        rows = box_rows(params)
        q_shape = (problem.batch, problem.seqlen_q, problem.heads_q, problem.head_dim)
        kv_shape = (problem.batch, problem.seqlen_k, problem.heads_kv, problem.head_dim)
        self._slots = [
            TensorMapSlot(self.buffer.address + i * TMA_DESC_BYTES, dtype=problem.dtype, shape=s, rows_box=rows[name])
            for i, (name, s) in enumerate((("q", q_shape), ("k", kv_shape), ("v", kv_shape), ("o", q_shape)))
        ]
        self._sizes = (problem.batch, problem.seqlen_q, problem.seqlen_k, problem.heads_q, problem.heads_kv)
        # the four maps of operands seen before, as one block: a cached call copies it in one move
        self._maps: dict[tuple[Operand, Operand, Operand, Operand], bytes] = {}
        self._maps_view = (ctypes.c_char * (len(self._slots) * TMA_DESC_BYTES)).from_address(self.buffer.address)

    def pack(self, q: Operand, k: Operand, v: Operand, o: Operand, lse: int, softmax_scale: float) -> None:
        operands = (q, k, v, o)
        known = self._maps.get(operands)
        if known is not None:
            self._maps_view.raw = known
        else:
            for slot, (ptr, batch_stride, row_stride, head_stride) in zip(self._slots, operands, strict=True):
                slot.encode(ptr, batch_stride * 2, row_stride * 2, head_stride * 2)  # 16-bit elements
            if len(self._maps) >= _REMEMBERED_MAPS:
                self._maps.clear()
            self._maps[operands] = self._maps_view.raw
        self.buffer.pack_scalars(lse, *self._sizes, softmax_scale, *self._extra())

    def _extra(self) -> tuple:
        return ()


_REMEMBERED_MAPS = 64  # blocks of four tensor maps kept per kernel and shape (a few addresses recur per call site)


class TmaSchedArgs(TmaArgs):
    """ABI ``sm90_tma_sched`` (family sm90): ``sm90_tma``'s arguments, then the tile counter and split-KV's
    counters and partials. They depend on the stream: the launch sets them (:meth:`set_tile_counter`,
    :meth:`set_split_workspace`); each is null, and never set, when the space's ``[launch.abi]`` says the
    kernel does not read it (``tile_counter`` 0, ``split_counter_bytes`` 0)."""

    abi = "sm90_tma_sched"

    def __init__(self, problem: Problem, params: Mapping[str, int]) -> None:
        super().__init__(problem, params)
        self.uses_tile_counter = uses_tile_counter(self.abi, params)
        self.split_workspace = split_workspace_bytes(self.abi, params)
        self._counter = 0
        self._split = (0, 0)
        last = len(ABI_PARAMS[self.abi]) - 1  # tile_counter, split_counters, split_partials
        self._counter_slot = ctypes.c_uint64.from_address(self.buffer.param_address(last - 2))
        self._split_slots = tuple(ctypes.c_uint64.from_address(self.buffer.param_address(last - i)) for i in (1, 0))

    def _extra(self) -> tuple:
        return (self._counter, *self._split)

    def set_tile_counter(self, ptr: int) -> None:
        self._counter = ptr
        self._counter_slot.value = ptr

    def set_split_workspace(self, counters: int, partials: int) -> None:
        self._split = (counters, partials)
        self._split_slots[0].value = counters
        self._split_slots[1].value = partials


def uses_tile_counter(abi: str, params: Mapping[str, int]) -> bool:
    """Whether a kernel of ``abi`` reads a tile counter: its ABI has one, and the space's ``[launch.abi]
    tile_counter`` (1 when absent) is not 0."""
    return any(p.name == "tile_counter" for p in ABI_PARAMS[abi]) and bool(int(params.get("tile_counter", 1)))


def split_workspace_bytes(abi: str, params: Mapping[str, int]) -> tuple[int, int] | None:
    """(counter bytes, partial bytes) of a split-KV kernel of ``abi``: its ABI has the workspace, and the space's
    ``[launch.abi] split_counter_bytes`` (0 when absent) is not 0; None for any other kernel."""
    counters = int(params.get("split_counter_bytes", 0))
    if not counters or not any(p.name == "split_counters" for p in ABI_PARAMS[abi]):
        return None
    return counters, int(params.get("split_partial_bytes", 0))


_TILE_COUNTER_BYTES = 8  # two uint32 words: units taken, CTAs done (kernel_src/README.md, ABI sm90_tma_sched)
_TILE_COUNTERS_PER_SLAB = 1024  # counters per device allocation: streams that can start without a new one
_PER_THREAD_STREAM = 2  # cudaStreamPerThread: one handle, a different stream in every host thread


def _current_device() -> int:
    return cupy.cuda.runtime.getDevice()


def _zeroed_device_memory(nbytes: int, stream: int | None, why: str | None = None) -> int:
    """``nbytes`` of zeroed memory on the current device, kept for the process; the zeros are in place on
    return. Refused while ``stream`` is capturing a CUDA graph (allocation and a synchronous memset are not
    allowed there); ``why`` says what needed the memory."""
    runtime = cupy.cuda.runtime
    if stream is not None and cupy.cuda.ExternalStream(stream).is_capturing():
        why = why or f"all {_TILE_COUNTERS_PER_SLAB} tile counters of this device are taken (one per stream)"
        raise LaunchError(
            f"{why} and new memory cannot be allocated while the stream captures a CUDA graph; launch the kernel "
            "once on this stream before capturing"
        )
    ptr = runtime.malloc(nbytes)
    runtime.memset(ptr, 0, nbytes)
    runtime.deviceSynchronize()
    return ptr


class TileCounters:
    """The dynamic tile scheduler's counters (ABI ``sm90_tma_sched``): one zeroed 8-byte counter per (device,
    stream), made at the stream's first launch and kept for the process. Two streams never share one (kernels
    running at once would take each other's units); launches on one stream run one after another, and each
    kernel leaves its counter zeroed, so it serves every later launch on the stream, the replays of a CUDA
    graph captured there included. Counters come from device allocations of ``_TILE_COUNTERS_PER_SLAB``
    made outside any capture (:meth:`reserve`, when a kernel that uses them is loaded), so a stream's first
    launch inside a capture takes one without a CUDA call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_stream: dict[tuple[int, int, int], int] = {}  # (device, stream, thread of a per-thread stream)
        self._free: dict[int, list[int]] = {}  # device -> counters not given to a stream yet

    def reserve(self, device: int) -> None:
        """Make sure ``device`` (the current device) has a free counter."""
        with self._lock:
            self._refill(device, None)

    def get(self, device: int, stream: int) -> int:
        """The counter of ``stream`` (a ``cudaStream_t`` handle) on ``device``, the current device."""
        key = (device, stream, threading.get_ident() if stream == _PER_THREAD_STREAM else 0)
        ptr = self._by_stream.get(key)
        if ptr is None:
            with self._lock:
                ptr = self._by_stream.get(key)
                if ptr is None:
                    self._refill(device, stream)
                    ptr = self._by_stream[key] = self._free[device].pop()
        return ptr

    def _refill(self, device: int, stream: int | None) -> None:
        free = self._free.setdefault(device, [])
        if not free:
            base = _zeroed_device_memory(_TILE_COUNTER_BYTES * _TILE_COUNTERS_PER_SLAB, stream)
            free.extend(base + i * _TILE_COUNTER_BYTES for i in reversed(range(_TILE_COUNTERS_PER_SLAB)))


#: the process's tile counters
TILE_COUNTERS = TileCounters()


_SPLIT_ALIGN = 256  # the partials start this far into a workspace's allocation, past the counters


class _Workspace:
    """One split-KV workspace: ``counter_bytes`` of counters (zeroed once; every kernel leaves them zero), then
    ``partial_bytes`` of partials (written before they are read), in one allocation."""

    __slots__ = ("counter_bytes", "counters", "partial_bytes", "partials")

    def __init__(self, counter_bytes: int, partial_bytes: int, stream: int | None, why: str | None) -> None:
        self.counter_bytes = -(-counter_bytes // _SPLIT_ALIGN) * _SPLIT_ALIGN
        self.partial_bytes = partial_bytes
        self.counters = _zeroed_device_memory(self.counter_bytes + partial_bytes, stream, why)
        self.partials = self.counters + self.counter_bytes

    def fits(self, counter_bytes: int, partial_bytes: int) -> bool:
        return counter_bytes <= self.counter_bytes and partial_bytes <= self.partial_bytes


class SplitWorkspaces:
    """Split-KV workspaces (ABI ``sm90_tma_sched``'s ``split_counters`` and ``split_partials``): one per (device,
    stream), at least as large as the largest problem launched on the stream so far, kept for the process. Two
    streams never share one (kernels running at once would count and overwrite each other's splits); launches
    on one stream run one after another and each leaves the counters zeroed, so one workspace serves every
    later launch on the stream, the replays of a CUDA graph captured there included, whatever the problem (the
    counters of a workspace are never partials: a larger problem gets a new workspace). An outgrown workspace
    is kept, not freed: a kernel queued on the stream may still use it. A loaded kernel reserves a spare of its
    size outside any capture (:meth:`reserve`), which the first stream that needs one takes without a CUDA call,
    so a launch inside a capture on a stream with no (large enough) workspace works once after each load."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_stream: dict[tuple[int, int, int], _Workspace] = {}  # as TileCounters'
        self._spare: dict[int, list[_Workspace]] = {}  # device -> reserved, not given to a stream yet
        self._retired: list[_Workspace] = []  # outgrown by their stream, still owned (a queued kernel may use them)

    def reserve(self, device: int, counter_bytes: int, partial_bytes: int) -> None:
        """Make sure ``device`` (the current device) has a spare workspace of at least these sizes."""
        with self._lock:
            spare = self._spare.setdefault(device, [])
            if not any(w.fits(counter_bytes, partial_bytes) for w in spare):
                spare.append(_Workspace(counter_bytes, partial_bytes, None, None))

    def get(self, device: int, stream: int, counter_bytes: int, partial_bytes: int) -> tuple[int, int]:
        """(counters, partials) of ``stream`` (a ``cudaStream_t`` handle) on ``device``, the current device, of at
        least these sizes."""
        key = (device, stream, threading.get_ident() if stream == _PER_THREAD_STREAM else 0)
        ws = self._by_stream.get(key)
        if ws is None or not ws.fits(counter_bytes, partial_bytes):
            with self._lock:
                ws = self._by_stream.get(key)
                if ws is None or not ws.fits(counter_bytes, partial_bytes):
                    ws = self._replace(device, stream, key, ws, counter_bytes, partial_bytes)
        return ws.counters, ws.partials

    def _replace(
        self, device: int, stream: int, key, old: _Workspace | None, counter_bytes: int, partial_bytes: int
    ) -> _Workspace:
        spare = self._spare.setdefault(device, [])
        fitting = [w for w in spare if w.fits(counter_bytes, partial_bytes)]
        if fitting:
            new = min(fitting, key=lambda w: (w.partial_bytes, w.counter_bytes))
            spare.remove(new)
        else:  # each part as large as the old one's, or twice that if it is too small (few workspaces retire)
            sizes = (counter_bytes, partial_bytes)
            if old is not None:
                sizes = tuple(
                    had if need <= had else max(need, 2 * had)
                    for need, had in zip(sizes, (old.counter_bytes, old.partial_bytes), strict=True)
                )
            have = f"{old.counter_bytes} + {old.partial_bytes} B" if old else "none"
            why = (
                f"this stream's split-KV workspace ({have}) is smaller than the kernel needs "
                f"({counter_bytes} + {partial_bytes} B)"
            )
            new = _Workspace(*sizes, stream, why)
        if old is not None:
            self._retired.append(old)
        self._by_stream[key] = new
        return new


#: the process's split-KV workspaces
SPLIT_WORKSPACES = SplitWorkspaces()


#: ABI name (a space file's ``[family] abi``) -> argument layout
ABIS: dict[str, type] = {cls.abi: cls for cls in (FlatArgs, TmaArgs, TmaSchedArgs)}
assert set(ABIS) == set(ABI_PARAMS), "every described ABI has a packer"


class Launcher:
    """Launches of one kernel for one problem's shape and dtype (its masking is compiled into the kernel):
    ``launcher(stream, q, k, v, o, lse, scale)`` packs the operands and launches on ``stream`` (a
    ``cudaStream_t`` as an int). Safe to call from several threads."""

    def __init__(self, kernel: Kernel, problem: Problem) -> None:
        self._args = ABIS[kernel.abi](problem, kernel.abi_params)
        self._function_ptr = kernel.function.ptr
        self._geometry = (kernel.grid, kernel.threads, kernel.smem_bytes)
        self._device = kernel.device
        self._lock = threading.Lock()

    def __call__(
        self, stream: int, q: Operand, k: Operand, v: Operand, o: Operand, lse: int, softmax_scale: float
    ) -> None:
        grid, threads, smem_bytes = self._geometry
        with self._lock:  # one argument buffer: pack and launch together
            args = self._args
            if args.uses_tile_counter:
                args.set_tile_counter(TILE_COUNTERS.get(self._device, stream))
            if args.split_workspace:
                args.set_split_workspace(*SPLIT_WORKSPACES.get(self._device, stream, *args.split_workspace))
            args.pack(q, k, v, o, lse, softmax_scale)
            launch_kernel(self._function_ptr, grid, threads, smem_bytes, stream, self._args.buffer.params_address)


def _operand(x) -> Operand:
    strides = x.strides
    return (x.data.ptr, strides[0] // x.itemsize, strides[1] // x.itemsize, strides[2] // x.itemsize)


class Kernel:
    """One loaded kernel with its launch geometry."""

    def __init__(
        self,
        function,
        *,
        abi: str,
        grid: tuple[int, int, int],
        threads: int,
        smem_bytes: int,
        config: Mapping[str, int],
        abi_params: Mapping[str, int] | None = None,
    ) -> None:
        if abi not in ABIS:
            raise ValueError(f"unknown kernel ABI {abi!r}; known: {', '.join(ABIS)}")
        self.function = function
        self.abi = abi
        self.grid, self.threads, self.smem_bytes = tuple(grid), threads, smem_bytes
        self.config = dict(config)
        self.abi_params = dict(abi_params or {})  # the space's [launch.abi] values for this config and shape
        # the device the function was loaded on (the current one), where a tile counter or workspace is needed
        self.device: int | None = None
        split = split_workspace_bytes(abi, self.abi_params)
        if uses_tile_counter(abi, self.abi_params) or split:
            self.device = _current_device()
        if uses_tile_counter(abi, self.abi_params):
            TILE_COUNTERS.reserve(self.device)
        if split:
            SPLIT_WORKSPACES.reserve(self.device, *split)
        if smem_bytes > 48 * 1024:  # opt in to more than the default 48 KB of dynamic shared memory
            driver.funcSetAttribute(function.ptr, _MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes)

    def launcher(self, problem: Problem) -> Launcher:
        return Launcher(self, problem)

    def args(self, q, k, v, o, lse, softmax_scale: float):
        """The arguments for CuPy arrays (bf16 as uint16 bits): an object :meth:`launch` takes, reusable."""
        batch, seqlen_q, heads_q, head_dim = q.shape
        _, seqlen_k, heads_kv, _ = k.shape
        if o.shape != q.shape or v.shape != k.shape or k.shape[0] != batch or k.shape[3] != head_dim:
            raise LaunchError(f"shapes disagree: q {q.shape}, k {k.shape}, v {v.shape}, o {o.shape}")
        if heads_q % heads_kv:
            raise LaunchError(f"heads_kv {heads_kv} must divide heads_q {heads_q}")
        if lse.shape != (batch, heads_q, seqlen_q) or lse.dtype != cupy.float32 or not lse.flags.c_contiguous:
            raise LaunchError(f"lse must be contiguous fp32 {(batch, heads_q, seqlen_q)}, got {lse.dtype} {lse.shape}")
        for x in (q, k, v, o):
            if x.itemsize != 2 or x.strides[3] != 2:
                raise LaunchError(
                    f"tensors must be 16-bit with a contiguous last dimension, got {x.dtype} strides {x.strides}"
                )
        dtype = _DTYPE_OF_STORAGE.get(q.dtype.name)
        if dtype is None:
            raise LaunchError(
                f"tensors must be stored as {' or '.join(_DTYPE_OF_STORAGE)} (bf16 as its bits), got {q.dtype}"
            )
        problem = Problem(
            batch=batch,
            seqlen_q=seqlen_q,
            seqlen_k=seqlen_k,
            heads_q=heads_q,
            heads_kv=heads_kv,
            head_dim=head_dim,
            dtype=dtype,
        )
        args = ABIS[self.abi](problem, self.abi_params)
        args.pack(_operand(q), _operand(k), _operand(v), _operand(o), lse.data.ptr, float(softmax_scale))
        return args

    def launch(self, args, stream=None) -> None:
        """Launch with :meth:`args`' result on ``stream`` (a CuPy stream, a ``cudaStream_t`` int, or None: CuPy's
        current stream)."""
        if stream is None:
            stream = cupy.cuda.get_current_stream()
        handle = stream if isinstance(stream, int) else stream.ptr
        if args.uses_tile_counter:
            args.set_tile_counter(TILE_COUNTERS.get(self.device, handle))
        if args.split_workspace:
            args.set_split_workspace(*SPLIT_WORKSPACES.get(self.device, handle, *args.split_workspace))
        launch_kernel(self.function.ptr, self.grid, self.threads, self.smem_bytes, handle, args.buffer.params_address)


@functools.lru_cache(maxsize=64)
def _module(cubin_path: str):
    module = cupy.cuda.function.Module()
    module.load_file(cubin_path)
    return module


def load_kernel(
    cubin_path: str,
    entry: str,
    *,
    abi: str,
    grid: tuple[int, int, int],
    threads: int,
    smem_bytes: int,
    config: Mapping[str, int],
    abi_params: Mapping[str, int] | None = None,
) -> Kernel:
    return Kernel(
        _module(cubin_path).get_function(entry),
        abi=abi,
        grid=tuple(grid),
        threads=threads,
        smem_bytes=smem_bytes,
        config=config,
        abi_params=abi_params,
    )
