"""A compiler stand-in for tune(): picklable (top level), instant, no nvcc.

Configs of the toy space (tests/conftest.py) with ``block_n == 32 and stages == 1`` fail to compile;
every other config "compiles" to a cubin path that does not exist.
"""

from __future__ import annotations

import os

from tuner.compile import CompiledKernel, CompileOutcome, Resources


def refuses(config: dict[str, int]) -> bool:
    return config.get("block_n") == 32 and config.get("stages") == 1


def fake_compiler(space_path: str, config: dict[str, int], problem, device) -> CompileOutcome:
    if refuses(config):
        return CompileOutcome(
            status="compile_error", reason=f"nvcc failed for toy {config}: error: static assertion failed (fake)"
        )
    name = "-".join(f"{k}{v}" for k, v in config.items())
    kernel = CompiledKernel(
        cubin_path=f"/nonexistent/{name}.cubin",
        entry="toy_fwd",
        arch=str(device.arch),
        options=(),
        resources=Resources(
            registers=96 + config.get("block_m", 0) // 4,
            spill_store_bytes=0,
            spill_load_bytes=0,
            stack_bytes=0,
            static_smem_bytes=0,
        ),
        seconds=0.01,
        cached=False,
    )
    return CompileOutcome(status="ok", payload=kernel)


def exploding_compiler(space_path: str, config: dict[str, int], problem, device) -> CompileOutcome:
    os._exit(3)  # the pool process dies (as if OOM-killed): BrokenProcessPool in the parent
