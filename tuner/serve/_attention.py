"""The launch plans behind ``tuner.attention`` and the calls on PyTorch tensors and CuPy arrays.

:func:`tuner.attention` (:mod:`._api`) hands its inputs to :func:`torch_attention` or
:func:`cupy_attention`. Inputs are CuPy arrays or PyTorch CUDA tensors of shape
``[batch, seqlen, heads, head_dim]`` (K and V may have fewer heads: grouped-query attention),
fp16 or bf16, last dimension contiguous. CuPy has no bfloat16, so a CuPy bf16 array is ``uint16`` or ``int16`` holding
the bits, as :mod:`tuner.gpu` makes them. The result has the kind, dtype and device
of ``q``. PyTorch tensors are passed by pointer, without DLPack or a copy; with PyTorch the
call is also an operator, ``torch.ops.flashtune.attention`` (:mod:`._torch_op`).

The first call for a (family, config, device, dtypes, shapes, causal) builds a launch plan:
the space is loaded and checked, the config resolved (a header, ``"auto"`` with ``tuned=``,
a dict or the defaults), the kernel compiled for the device (the on-disk cubin cache makes
that a lookup after the first time), loaded, and its launch geometry and argument buffer
made. Later calls look the plan up and only allocate O and LSE, make the tensor maps or
pointers, pack the arguments and launch on the current stream (PyTorch's current stream for
tensors, which is the capture stream inside ``torch.cuda.graph``: calls can be captured).
The plan is keyed on the *content* of the space file and of the config header or dispatch
JSON (:func:`tuner.files.read_content`: one ``stat`` per file per call), so an edited file is
never served stale. Every cache lives in one :class:`PlanCache`, which :func:`clear_cache`
empties. Importing this module needs no GPU, CuPy or PyTorch.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..devices import DeviceLimits
from ..errors import FlashtuneError
from ..export import MAX_HEADER_BYTES, HeaderError, decode_header, header_family, parse_header
from ..files import FileContentError, read_content
from ..problem import DTYPES, Problem
from ..progress import log
from ..space import AUTO_FAMILY, Config, ConfigError, Space, complete, load_space
from ._family import FamilyChoiceError, resolve_family
from ._tuned import TunedConfigs, TunedError, shipped_tuned, tuned_configs

__all__ = [
    "CAPTURE_FIRST_CALL",
    "FORWARD_ONLY",
    "AttentionError",
    "AutoConfigWarning",
    "PlanCache",
    "clear_cache",
    "cupy_attention",
    "torch_attention",
]

FORWARD_ONLY = (
    "flashtune kernels are forward-only (inference and forward benchmarks): q, k or v requires grad; "
    "call under torch.no_grad() or torch.inference_mode(), or pass detached tensors"
)
CAPTURE_FIRST_CALL = (
    "the first call for this shape and config compiles and loads its kernel, which cannot happen "
    "while a CUDA graph is being captured; make one call before capturing (a warm-up)"
)
_MAX_PLANS = 4096


class AttentionError(FlashtuneError, ValueError):
    """The inputs or the config cannot run on this kernel family and device."""


class AutoConfigWarning(UserWarning):
    """``config="auto"`` serves a family default where no tuned config covers the call, or where the tuned one
    cannot run its shape (once per plan)."""


# -- the caches: keyed on file contents, not names ------------------------------------------------
class PlanCache:
    """Every cache behind ``tuner.attention``, and the lock that plans are built under.

    Files are remembered under (path, digest of their content) and each call stats them, so an
    edited file is never served stale. A cached call reads :attr:`plans` and :attr:`space_paths`
    without the lock (one dict lookup each); only building a plan takes it.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.space_paths: dict[Any, str] = {}  # family as given -> its space file
        self.spaces: dict[tuple[str, str], Space] = {}  # (space file, content digest) -> Space
        self.header_configs: dict[tuple, Config] = {}  # (header, digest, space key, problem kind) -> Config
        self.header_families: dict[tuple[str, str], str] = {}  # (header, digest) -> the family it names
        self.plans: dict[tuple, _Plan] = {}  # the key of a call (see torch_attention) -> its plan
        self.limits: dict[int, Any] = {}  # device index -> its DeviceLimits
        self.cubins: dict[tuple, tuple[str, str]] = {}  # (space, config, macros, arch) -> (cubin path, entry)
        self.modules: dict[tuple[int, str], Any] = {}  # (device index, cubin path) -> loaded CuPy module
        # cupy.cuda.driver and .runtime, set by the first plan: imported modules, not cached content
        self.driver: Any = None
        self.runtime: Any = None

    def caches(self) -> tuple[dict, ...]:
        return (
            self.space_paths,
            self.spaces,
            self.header_configs,
            self.header_families,
            self.plans,
            self.limits,
            self.cubins,
            self.modules,
        )

    def clear(self) -> None:
        """Empty every cache (a kernel module stays loaded while a plan that launches it is alive)."""
        with self.lock:
            for cache in self.caches():
                cache.clear()


_cache = PlanCache()


def _space_key(family: Any) -> tuple[str, str]:
    """(space file, digest of its content): one ``stat`` while the file is unchanged."""
    path = _cache.space_paths.get(family)
    if path is None:
        space = load_space(family)  # an unknown family raises its SpaceError here
        path = _cache.space_paths[family] = str(space.path)
    try:
        digest, _ = read_content(path)
    except FileContentError:
        _cache.space_paths.pop(family, None)
        load_space(family)  # the error of a file that went away
        raise
    return path, digest


def _space(space_key: tuple[str, str]) -> Space:
    space = _cache.spaces.get(space_key)
    if space is None:
        if len(_cache.spaces) > 64:
            _cache.spaces.clear()
        space = _cache.spaces[space_key] = load_space(Path(space_key[0]))
    return space


_AUTO_CONFIG = ("auto", None)  # config="auto" without tuned=: the table shipped for the device's GPU


def _config_key(config: Any, tuned: Any) -> tuple:
    if isinstance(config, str) and config == "auto":
        if tuned is None:
            return _AUTO_CONFIG  # the shipped table is found when the plan is built
        try:
            return ("auto", tuned_configs(tuned))
        except TunedError as e:
            raise AttentionError(str(e)) from None
    if tuned is not None:
        raise AttentionError("tuned= goes with config='auto'")
    if config is None:
        return ("defaults",)
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        try:
            digest, _ = read_content(path, limit_bytes=MAX_HEADER_BYTES)
        except FileContentError as e:
            raise AttentionError(f"cannot read config header {str(e).removeprefix('cannot read ')}") from None
        return ("header", path, digest)
    if isinstance(config, Mapping):
        try:
            items = tuple(sorted(config.items()))
            hash(items)
        except TypeError:
            raise AttentionError(f"config must map knob names to integers, got {str(dict(config))[:200]}") from None
        return ("knobs", items)
    raise AttentionError(
        f"config must be None, 'auto', a dict of knob values or the path of an exported header, "
        f"not {type(config).__name__}"
    )


def _header_family(config_key: tuple) -> str:
    _, path, digest = config_key
    family = _cache.header_families.get((path, digest))
    if family is None:
        try:
            _, data = read_content(path, limit_bytes=MAX_HEADER_BYTES)
            family = header_family(decode_header(data, path), path)
        except (FileContentError, HeaderError) as e:
            raise AttentionError(str(e)) from None
        if len(_cache.header_families) > 256:
            _cache.header_families.clear()
        _cache.header_families[(path, digest)] = family
    return family


def _tuned_of(config_key: tuple, gpu_name: str) -> TunedConfigs | None:
    """The table ``config="auto"`` selects from: the user's ``tuned=``, else the one shipped for this GPU."""
    if config_key[0] != "auto":
        return None
    return config_key[1] if config_key[1] is not None else shipped_tuned(gpu_name)


def completed(space: Space, config: Mapping[str, Any], problem: Problem, device: DeviceLimits) -> Config:
    """A partial config made whole (:func:`tuner.space.complete`), the defaults it moved logged (never a silent change;
    once per plan: plans are built once per key); one that cannot run is an :class:`AttentionError`."""
    try:
        completion = complete(space, config, problem, device)
    except ConfigError as e:
        raise AttentionError(str(e)) from None
    if completion.note:
        log.info(completion.note)
    return completion.config


def _chosen_config(
    space: Space,
    space_key: tuple[str, str],
    config_key: tuple,
    tuned: TunedConfigs | None,
    problem: Problem,
    device: DeviceLimits,
) -> Config:
    kind = config_key[0]
    if kind == "defaults":
        return space.defaults(problem=problem, device=device)
    if kind == "knobs":  # knobs left out: the head dim's and arch's defaults (a rule's would not fit the given ones)
        return completed(space, dict(config_key[1]), problem, device)
    if kind == "auto":
        try:
            config, why_default = tuned.lookup(space, problem, device.arch, device)
        except TunedError as e:
            raise AttentionError(str(e)) from None
        if why_default:  # never a silent downgrade: once per plan (plans are built once per key)
            warnings.warn(f"flashtune config='auto': {why_default}", AutoConfigWarning, stacklevel=5)
        return config
    _, path, digest = config_key
    made_for = (problem.head_dim, problem.dtype, bool(problem.causal))
    key = (path, digest, space_key, made_for)
    config = _cache.header_configs.get(key)
    if config is None:
        try:
            _, data = read_content(path, limit_bytes=MAX_HEADER_BYTES)
            config = parse_header(decode_header(data, path), path, space, problem)
        except (FileContentError, HeaderError) as e:
            raise AttentionError(str(e)) from None
        if len(_cache.header_configs) > 256:
            _cache.header_configs.clear()
        _cache.header_configs[key] = config
    return config


# -- plans ------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class _Plan:
    """Everything a call needs that does not depend on the tensors' addresses."""

    launcher: Any  # tuner.gpu.launch.Launcher
    device: int
    context: int  # the CUcontext the kernel was loaded in
    lse_shape: tuple[int, int, int]
    o_strides: tuple[int, int, int]  # of a fresh contiguous O: batch, row, head (elements)
    default_scale: float
    config: Config
    problem: Problem
    family: Any  # the family the plan runs (resolved from "auto"), and its space file's key when built
    space_key: tuple[str, str]
    # an LSE buffer per library ("torch", "cupy") for calls that do not return it: the kernel always writes
    # one, and not allocating it saves host time per call (several streams may write it at once: nobody reads it)
    scratch_lse: dict[str, Any] = field(default_factory=dict)

    def launch(self, stream: int, q, k, v, o, lse: int, scale: float) -> None:
        if _current_context() == self.context:
            self.launcher(stream, q, k, v, o, lse, scale)
            return
        runtime = _cache.runtime
        previous = runtime.getDevice()  # another device is current in this thread: switch for the launch
        runtime.setDevice(self.device)
        try:
            self.launcher(stream, q, k, v, o, lse, scale)
        finally:
            runtime.setDevice(previous)


def _current_context() -> int:
    """The calling thread's current CUcontext (0 when none)."""
    return _cache.driver.ctxGetCurrent()


def _select_device(device_id: int):
    """A context manager making ``device_id`` current (CuPy's; the context the kernel is loaded in)."""
    import cupy

    return cupy.cuda.Device(device_id)


def clear_cache() -> None:
    """Forget every launch plan, remembered file, compiled and loaded kernel and device's limits (the next
    call of each shape builds its plan again)."""
    _cache.clear()


def _device_limits(device_id: int):
    from ..devices import DeviceLimits
    from ..gpu import gpu_info

    limits = _cache.limits
    if device_id not in limits:
        limits[device_id] = DeviceLimits.from_info(gpu_info())  # of the current device: the caller selects it
    return limits[device_id]


def _load_function(space: Space, config: Config, problem: Problem, device, device_id: int):
    """The kernel function for (config, problem macros) on this device: compiled once, loaded once per device."""
    import cupy

    from ..compile import compile_config
    from ..space import config_key

    macros = space.macros(config, problem, device)
    key = (str(space.path), config_key(config), tuple(sorted(macros.items())), device.arch)
    cubins, modules = _cache.cubins, _cache.modules
    if key not in cubins:
        kernel = compile_config(space, config, problem, device)
        cubins[key] = (kernel.cubin_path, kernel.entry)
    cubin_path, entry = cubins[key]
    if (device_id, cubin_path) not in modules:
        module = cupy.cuda.function.Module()
        module.load_file(cubin_path)
        modules[(device_id, cubin_path)] = module
    return modules[(device_id, cubin_path)].get_function(entry)


def _problem(q, k, v, dtypes: tuple[str, str, str], causal: bool) -> Problem:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            raise AttentionError(f"{name} must be [batch, seqlen, heads, head_dim], got shape {tuple(x.shape)}")
    if len(set(dtypes)) != 1:
        raise AttentionError(f"q, k and v must share a dtype, got {', '.join(dtypes)}")
    if tuple(k.shape) != tuple(v.shape):
        raise AttentionError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise AttentionError(f"k and v must match q in batch and head_dim: q {tuple(q.shape)}, k {tuple(k.shape)}")
    batch, seqlen_q, heads_q, head_dim = (int(s) for s in q.shape)
    try:
        return Problem(
            batch=batch,
            seqlen_q=seqlen_q,
            seqlen_k=int(k.shape[1]),
            heads_q=heads_q,
            heads_kv=int(k.shape[2]),
            head_dim=head_dim,
            dtype=dtypes[0],
            causal=bool(causal),
        )
    except FlashtuneError as e:
        raise AttentionError(str(e)) from None


def _family_key(family: Any) -> Any:
    """A call's family in its plan key: ``"auto"`` as given (the plan remembers the space file it resolved to),
    else (space file, digest of its content): one ``stat`` while the file is unchanged."""
    if isinstance(family, str) and family == AUTO_FAMILY:
        return family
    return ("space", *_space_key(family))


def _is_current(plan: _Plan | None, family_key: Any) -> bool:
    """A cached plan whose space file is unchanged: in the key, or for ``"auto"`` checked here (one ``stat``)."""
    if plan is None:
        return False
    return not isinstance(family_key, str) or _space_key(plan.family) == plan.space_key


def _build_plan(key: tuple, q, k, v, dtypes: tuple[str, str, str], causal: bool, device_id: int, capturing) -> _Plan:
    """Validate everything about the call and build its plan (the slow path: once per key)."""
    family, config_key = key[0], key[1]
    with _cache.lock:
        plan = _cache.plans.get(key)
        if _is_current(plan, family):
            return plan
        problem = _problem(q, k, v, dtypes, causal)
        if capturing():
            raise AttentionError(CAPTURE_FIRST_CALL)
        from cupy.cuda import driver, runtime

        _cache.driver, _cache.runtime = driver, runtime
        with _select_device(device_id):
            device = _device_limits(device_id)
            tuned = _tuned_of(config_key, device.name)
            if not isinstance(family, str):  # a family given by name or path: its space file is in the key
                family = family[1]
            try:
                family = resolve_family(
                    family,
                    config_key[0],
                    device.arch,
                    problem,
                    tuned=tuned,
                    header_family=lambda: _header_family(config_key),
                )
            except FamilyChoiceError as e:
                raise AttentionError(str(e)) from None
            space_key = _space_key(family)
            space = _space(space_key)
            reason = space.supports(problem)
            if reason:
                raise AttentionError(reason)
            chosen = _chosen_config(space, space_key, config_key, tuned, problem, device)
            reason = space.check(chosen, problem, device)
            if reason:
                raise AttentionError(f"config {chosen} cannot run this problem on {device.name}: {reason}")
            launcher = _launcher(space, chosen, problem, device, device_id)
            context = _current_context()
        p = problem
        plan = _Plan(
            launcher=launcher,
            device=device_id,
            context=context,
            lse_shape=(p.batch, p.heads_q, p.seqlen_q),
            o_strides=(p.seqlen_q * p.heads_q * p.head_dim, p.heads_q * p.head_dim, p.head_dim),
            default_scale=1.0 / math.sqrt(p.head_dim),
            config=chosen,
            problem=problem,
            family=family,
            space_key=space_key,
        )
        plans = _cache.plans
        if len(plans) >= _MAX_PLANS:
            for old in list(plans)[: _MAX_PLANS // 2]:  # the oldest half
                del plans[old]
        plans[key] = plan
        return plan


def _launcher(space: Space, chosen: Config, problem: Problem, device, device_id: int):
    """The kernel of ``chosen`` for ``problem``, loaded on the device, as a launcher of its geometry."""
    from ..gpu import Kernel

    geometry = space.launch(chosen, problem, device)
    kernel = Kernel(
        _load_function(space, chosen, problem, device, device_id),
        abi=space.family.abi,
        grid=geometry.grid,
        threads=geometry.threads,
        smem_bytes=geometry.smem_bytes,
        config=chosen,
        abi_params=geometry.abi,
    )
    return kernel.launcher(problem)


# -- PyTorch tensors ------------------------------------------------------------------------------------
def _torch_device(t) -> int:
    """The CUDA device index of a tensor, -1 when it is not on a CUDA device."""
    return t.get_device() if t.is_cuda else -1


def _torch_stream(torch, device: int) -> int:
    """PyTorch's current stream on ``device`` (the capture stream inside ``torch.cuda.graph``), as a handle."""
    global _raw_stream
    if _raw_stream is None:  # what Inductor's generated code calls (no stream object made), where PyTorch has it
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _raw_stream = raw or (lambda index: torch.cuda.current_stream(index).cuda_stream)
    return _raw_stream(device)


_raw_stream: Callable[[int], int] | None = None


def _torch_capturing(torch) -> bool:
    return bool(torch.cuda.is_current_stream_capturing())


def _torch_dtype(torch, t) -> str:
    for name, d in DTYPES.items():
        if t.dtype == getattr(torch, d.torch_name):
            return name
    raise AttentionError(f"tensors must be float16 or bfloat16, got {t.dtype}")


def _torch_operand(torch, x):
    """(tensor the kernel can read, operand): a copy on the caller's stream when the kernel cannot address it."""
    stride = x.stride()
    ptr = x.data_ptr()
    b, n, h, d = stride
    if ptr % 16 or d != 1 or (b | n | h) % 8 or min(b, n, h) <= 0:  # 16-bit elements: 16-byte multiples
        x = x.clone(memory_format=torch.contiguous_format)
        stride = x.stride()
        ptr = x.data_ptr()
    return x, (ptr, stride[0], stride[1], stride[2])


def torch_attention(
    torch,
    q,
    k,
    v,
    causal: bool,
    softmax_scale,
    family,
    config,
    tuned,
    want_lse: bool = True,
    on_new_plan: Callable[[], object] | None = None,
):
    """``tuner.attention`` on PyTorch tensors: (O, LSE or None). ``on_new_plan`` is called before a plan is
    built (``tuner.attention`` registers the PyTorch operator with it)."""
    tensor = torch.Tensor
    if not (isinstance(k, tensor) and isinstance(v, tensor)):
        raise AttentionError("q, k and v must all be CuPy arrays or all PyTorch tensors")
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise AttentionError(FORWARD_ONLY)
    device = _torch_device(q)
    key = (
        _family_key(family),
        _config_key(config, tuned),
        device,
        _torch_device(k),
        _torch_device(v),
        q.dtype,
        k.dtype,
        v.dtype,
        q.shape,
        k.shape,
        v.shape,
        causal,
    )
    plan = _cache.plans.get(key)
    if not _is_current(plan, key[0]):
        if on_new_plan is not None:
            on_new_plan()
        for name, x in (("q", q), ("k", k), ("v", v)):
            if _torch_device(x) < 0:
                raise AttentionError(f"tensors must be on a CUDA device, got {x.device} for {name}")
        if not device == key[3] == key[4]:
            raise AttentionError(f"q, k and v must be on one device, got {q.device}, {k.device} and {v.device}")
        dtypes = (_torch_dtype(torch, q), _torch_dtype(torch, k), _torch_dtype(torch, v))
        plan = _build_plan(key, q, k, v, dtypes, causal, device, lambda: _torch_capturing(torch))
    q, qa = _torch_operand(torch, q)
    k, ka = _torch_operand(torch, k)
    v, va = _torch_operand(torch, v)
    o = torch.empty_like(q, memory_format=torch.contiguous_format)  # half new_empty(q.shape)'s host time
    lse = plan.scratch_lse.get("torch") if not want_lse else None
    if lse is None:
        lse = q.new_empty(plan.lse_shape, dtype=torch.float32)
        if not want_lse and not _torch_capturing(torch):  # an allocation made inside a capture is the graph's
            plan.scratch_lse["torch"] = lse
    scale = plan.default_scale if softmax_scale is None else float(softmax_scale)
    plan.launch(_torch_stream(torch, device), qa, ka, va, (o.data_ptr(), *plan.o_strides), lse.data_ptr(), scale)
    return o, (lse if want_lse else None)


def torch_sdpa_launch(torch, q, k, v, causal: bool, scale, family, config, tuned, device: int, on_new_plan=None):
    """:func:`tuner.sdpa`'s kernel path: ``[B, H, N, D]`` tensors that :func:`tuner.serve._sdpa.kernel_refusal`
    passed (one CUDA device, fp16/bf16, shapes that pair up, addressable strides, no grad), launched as
    the ``[B, N, H, D]`` views they are (batch, row and head strides swapped, no view made), into an O
    allocated ``[B, H, N, D]``-shaped over ``[B, N, H, D]`` memory. The cached path does no more than
    this: the plan key, one allocation, the launch (the checks were the caller's)."""
    if family == AUTO_FAMILY and tuned is None and isinstance(config, str) and config == "auto":
        key = (AUTO_FAMILY, _AUTO_CONFIG, "bhnd", device, q.dtype, q.shape, k.shape, v.shape, causal)  # the usual call
    else:
        key = (
            _family_key(family),
            _config_key(config, tuned),
            "bhnd",
            device,
            q.dtype,
            q.shape,
            k.shape,
            v.shape,
            causal,
        )
    plan = _cache.plans.get(key)
    if not _is_current(plan, key[0]):
        if on_new_plan is not None:
            on_new_plan()
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        dtypes = (_torch_dtype(torch, q),) * 3
        plan = _build_plan(key, qt, kt, vt, dtypes, causal, device, lambda: _torch_capturing(torch))
    sq, sk, sv = q.stride(), k.stride(), v.stride()
    b, h, n, d = q.shape
    o = q.new_empty_strided((b, h, n, d), (n * h * d, d, h * d, 1))
    lse = plan.scratch_lse.get("torch")
    if lse is None:
        lse = q.new_empty(plan.lse_shape, dtype=torch.float32)
        if not _torch_capturing(torch):  # an allocation made inside a capture is the graph's
            plan.scratch_lse["torch"] = lse
    plan.launch(
        _torch_stream(torch, device),
        (q.data_ptr(), sq[0], sq[2], sq[1]),
        (k.data_ptr(), sk[0], sk[2], sk[1]),
        (v.data_ptr(), sv[0], sv[2], sv[1]),
        (o.data_ptr(), *plan.o_strides),
        lse.data_ptr(),
        plan.default_scale if scale is None else float(scale),
    )
    return o


# -- CuPy arrays --------------------------------------------------------------------------------------
def _cupy_dtype(cupy, x) -> str:
    if x.dtype == cupy.float16:
        return "fp16"
    if x.dtype in (cupy.uint16, cupy.int16) or str(x.dtype) == "bfloat16":
        return "bf16"
    raise AttentionError(f"arrays must be float16, or bf16 bits as uint16/int16, got {x.dtype}")


def _cupy_operand(x):
    """(array the kernel can read, operand): a fresh C-contiguous copy when the kernel cannot address it."""
    strides = x.strides
    ptr = x.data.ptr
    if (
        ptr % 16
        or strides[3] != 2
        or strides[0] % 16
        or strides[1] % 16
        or strides[2] % 16
        or strides[0] <= 0
        or strides[1] <= 0
        or strides[2] <= 0
    ):
        x = x.copy()  # ascontiguousarray keeps a contiguous misaligned array as it is
        strides = x.strides
        ptr = x.data.ptr
    return x, (ptr, strides[0] // 2, strides[1] // 2, strides[2] // 2)


def cupy_attention(q, k, v, causal: bool, softmax_scale, family, config, tuned, want_lse: bool = True):
    """``tuner.attention`` on CuPy arrays (or inputs of no known kind, which it refuses): (O, LSE or None)."""
    import cupy

    if not all(isinstance(x, cupy.ndarray) for x in (q, k, v)):
        torch = sys.modules.get("torch")
        if torch is not None and any(isinstance(x, torch.Tensor) for x in (k, v)):
            raise AttentionError("q, k and v must all be CuPy arrays or all PyTorch tensors")
        raise AttentionError(f"inputs must be CuPy arrays or PyTorch tensors, got {type(q).__name__}")
    device = q.device.id
    key = (
        _family_key(family),
        _config_key(config, tuned),
        device,
        k.device.id,
        v.device.id,
        q.dtype,
        k.dtype,
        v.dtype,
        q.shape,
        k.shape,
        v.shape,
        causal,
    )
    with cupy.cuda.Device(device):
        plan = _cache.plans.get(key)
        if not _is_current(plan, key[0]):
            if not device == key[3] == key[4]:
                raise AttentionError(f"q, k and v must be on one device, got {device}, {key[3]} and {key[4]}")
            dtypes = (_cupy_dtype(cupy, q), _cupy_dtype(cupy, k), _cupy_dtype(cupy, v))
            plan = _build_plan(
                key, q, k, v, dtypes, causal, device, lambda: cupy.cuda.get_current_stream().is_capturing()
            )
        q, qa = _cupy_operand(q if q.dtype == cupy.float16 else q.view(cupy.uint16))
        k, ka = _cupy_operand(k if k.dtype == cupy.float16 else k.view(cupy.uint16))
        v, va = _cupy_operand(v if v.dtype == cupy.float16 else v.view(cupy.uint16))
        o = cupy.empty(q.shape, dtype=q.dtype)
        lse = plan.scratch_lse.get("cupy") if not want_lse else None
        if lse is None:
            lse = cupy.empty(plan.lse_shape, dtype=cupy.float32)
            if not want_lse and not cupy.cuda.get_current_stream().is_capturing():
                plan.scratch_lse["cupy"] = lse
        scale = plan.default_scale if softmax_scale is None else float(softmax_scale)
        plan.launch(cupy.cuda.get_current_stream().ptr, qa, ka, va, (o.data.ptr, *plan.o_strides), lse.data.ptr, scale)
    return o, (lse if want_lse else None)
