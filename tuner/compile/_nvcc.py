"""Compile one config of a kernel family to a cubin, through CuPy's nvcc driver, with a disk cache.

The cache key covers the family's sources (its source, config header and every file they include
from its kernel directory: ``Space.source_digest``), the compiler flags (the kernel directory is the
include path), the target arch and the nvcc version, so a repeated config is never recompiled and an
edited header is never served stale. A compile needs nvcc, not a GPU.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..devices import DeviceLimits
from ..errors import FlashtuneError, warn
from ..outcome import Outcome, Status
from ..paths import KERNEL_SRC
from ..problem import Problem
from ..space import Config, Space, load_space
from ._ptxas import Resources, parse_ptxas

__all__ = [
    "CompileError",
    "CompileOutcome",
    "CompiledKernel",
    "cache_dir",
    "compile_config",
    "compile_outcome",
    "nvcc_options",
]

_BASE_OPTIONS = ("-O3", "-std=c++17", "-Xptxas=-v", "--use_fast_math")


class CompileError(FlashtuneError, RuntimeError):
    """nvcc rejected a config. ``log`` holds the compiler output."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


@dataclass(frozen=True, kw_only=True)
class CompiledKernel:
    cubin_path: str
    entry: str
    arch: str
    options: tuple[str, ...]
    resources: Resources
    seconds: float
    cached: bool

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["resources"] = self.resources.to_dict()
        return d


def cache_dir() -> Path:
    """``$FLASHTUNE_CACHE_DIR``, else ``$XDG_CACHE_HOME/flashtune``, else ``~/.cache/flashtune``."""
    if os.environ.get("FLASHTUNE_CACHE_DIR"):
        return Path(os.environ["FLASHTUNE_CACHE_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "flashtune"


def nvcc_options(macros: dict[str, int], root: Path | None = None) -> tuple[str, ...]:
    """Compiler options as an argument list (never a shell string): include path (the family's kernel
    directory, default the package's kernel_src/), base flags, -D per macro."""
    include = str(root if root is not None else KERNEL_SRC)
    return ("-I", include, *_BASE_OPTIONS, *(f"-D{name}={value}" for name, value in macros.items()))


@functools.cache
def _nvcc_version() -> str:
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc") or "nvcc"
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise CompileError(f"nvcc not found or not working ({e}); install the CUDA toolkit or set NVCC") from None
    return out.strip().splitlines()[-1]


def compile_config(
    space: Space, config: Config, problem: Problem, device: DeviceLimits, *, use_cache: bool = True
) -> CompiledKernel:
    """Build ``config`` for ``problem`` on ``device``'s arch; raise :class:`CompileError` on failure."""
    macros = space.build_macros(config, problem, device)
    options = nvcc_options(macros, space.root)
    arch = space.arch_string(device.arch)
    entry = space.family.entry
    key_text = json.dumps([_nvcc_version(), arch, options, space.source_digest(), space.family.source])
    key = hashlib.sha256(key_text.encode()).hexdigest()[:32]
    directory = cache_dir() / "cubins"
    cubin_path, meta_path = directory / f"{key}.cubin", directory / f"{key}.json"
    if use_cache and cubin_path.is_file() and meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        return CompiledKernel(
            cubin_path=str(cubin_path),
            entry=entry,
            arch=arch,
            options=options,
            resources=Resources(**meta["resources"]),
            seconds=0.0,
            cached=True,
        )

    from cupy.cuda import compiler  # deferred: importing CuPy is slow, and `check` may run without it

    source = f'#include "{space.family.source}"\n'
    log = io.StringIO()
    start = time.perf_counter()
    try:
        cubin = compiler.compile_using_nvcc(source, options=options, arch=arch, filename="flashtune.cu", log_stream=log)
    except compiler.CompileException as e:
        raise CompileError(f"nvcc failed for {space.name} {config}: {_first_error(str(e))}", str(e)) from None
    seconds = time.perf_counter() - start
    resources = parse_ptxas(log.getvalue(), entry)
    path = _store(directory, key, cubin, {"resources": resources.to_dict(), "options": list(options), "arch": arch})
    return CompiledKernel(
        cubin_path=str(path) if path else _scratch_copy(key, cubin),
        entry=entry,
        arch=arch,
        options=options,
        resources=resources,
        seconds=seconds,
        cached=False,
    )


#: What a compile process returns: status ok with the kernel as payload, or compile_error and why.
CompileOutcome = Outcome[CompiledKernel]


@functools.lru_cache(maxsize=8)
def _space(path: str) -> Space:
    return load_space(path)


def compile_outcome(space_path: str, config: Config, problem: Problem, device: DeviceLimits) -> CompileOutcome:
    """Compile in a pool process (the space is named by its file, loaded once per process); never
    raises: a failure is an outcome."""
    try:
        return CompileOutcome(status=Status.OK, payload=compile_config(_space(space_path), config, problem, device))
    except CompileError as e:
        return CompileOutcome(status=Status.COMPILE_ERROR, reason=str(e))
    except Exception as e:
        return CompileOutcome(status=Status.COMPILE_ERROR, reason=f"{type(e).__name__}: {e}")


def _first_error(text: str) -> str:
    for line in text.splitlines():
        if "error" in line.lower():
            return line.strip()[:300]
    return text.strip().splitlines()[0][:300] if text.strip() else "unknown error"


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _store(directory: Path, key: str, cubin: bytes, meta: dict[str, object]) -> Path | None:
    """Write cubin and metadata (cubin first: the metadata marks a complete entry). None if the disk refused."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _atomic_write(directory / f"{key}.cubin", cubin)
        try:
            _atomic_write(directory / f"{key}.json", json.dumps(meta).encode())
        except OSError:
            (directory / f"{key}.cubin").unlink(missing_ok=True)  # no entry without its metadata
            raise
        return directory / f"{key}.cubin"
    except OSError as e:
        warn(f"cubin cache at {directory} not written ({e.strerror}); compiling without cache")
        return None


def _scratch_copy(key: str, cubin: bytes) -> str:
    """Where the cache cannot take a cubin, keep it in memory-backed temp storage for this run."""
    import tempfile

    fd, name = tempfile.mkstemp(prefix=f"flashtune-{key}-", suffix=".cubin")
    with os.fdopen(fd, "wb") as f:
        f.write(cubin)
    return name
