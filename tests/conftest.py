"""Shared fixtures: a private cubin cache for the session, a small toy space, the real space files."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # spawned children inherit sys.path, so tests.fakes stays importable there
    sys.path.insert(0, str(REPO_ROOT))

from tuner.devices import KNOWN_ARCHS, limits_for_arch  # noqa: E402
from tuner.paths import KERNEL_SRC, SEARCH_SPACES  # noqa: E402
from tuner.problem import Problem  # noqa: E402

#: every space file present when the tests are collected (families may appear while others work on them)
SPACE_FILES = sorted(SEARCH_SPACES.glob("*.toml"))


def family_params() -> list:
    if not SPACE_FILES:
        return [pytest.param(None, marks=pytest.mark.skip(reason="no space file in search_spaces/"))]
    return [pytest.param(p, id=p.stem) for p in SPACE_FILES]


def supported_archs(space) -> list[int]:
    """Archs a family must run on: every known arch from min_arch on; an arch-specific ('a') target only its own."""
    if space.family.arch_suffix:
        return [a for a in KNOWN_ARCHS if a == space.family.min_arch]
    return [a for a in KNOWN_ARCHS if a >= space.family.min_arch]


def require_family(name: str) -> Path:
    path = SEARCH_SPACES / f"{name}.toml"
    if not path.is_file():
        pytest.skip(f"search_spaces/{name}.toml is not written yet")
    return path


@pytest.fixture(scope="session", autouse=True)
def _session_cache_dir(tmp_path_factory):
    """Keep every cubin of the run in one temporary cache (shared with spawned compile processes)."""
    old = os.environ.get("FLASHTUNE_CACHE_DIR")
    os.environ["FLASHTUNE_CACHE_DIR"] = str(tmp_path_factory.mktemp("cubin-cache"))
    yield
    if old is None:
        os.environ.pop("FLASHTUNE_CACHE_DIR", None)
    else:
        os.environ["FLASHTUNE_CACHE_DIR"] = old


def compile_config_header(space, macros: dict[str, int], arch: str, tmp_path: Path):
    """nvcc on a unit that includes only ``space``'s config header (its static_asserts), with ``macros`` as -D
    flags, for sm_``arch`` (``90a``): the finished process, its stderr holding any refusal."""
    import subprocess

    unit = tmp_path / "config_only.cu"
    unit.write_text(f'#include "{space.family.config_header}"\n')
    return subprocess.run(
        ["nvcc", "-std=c++17", "-I", str(KERNEL_SRC), f"-arch=sm_{arch}", "-c", "-o", str(tmp_path / "config_only.o")]
        + [f"-D{k}={v}" for k, v in macros.items()]
        + [str(unit)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def build_host_check(source: Path, exe: Path, macros: dict[str, int] | None = None) -> Path:
    """nvcc builds ``source`` (a .cu of host code that includes kernel_src/ headers) into the program ``exe``."""
    import subprocess

    defines = [f"-D{k}={v}" for k, v in (macros or {}).items()]
    subprocess.run(
        ["nvcc", "-std=c++17", "-O2", "-x", "cu", "-I", str(KERNEL_SRC), *defines, str(source), "-o", str(exe)],
        check=True,
        capture_output=True,
        text=True,
    )
    return exe


def real_kernel_files() -> tuple[str, str]:
    """(source, config_header) of some existing family, relative to kernel_src/ (a toy space must name real files)."""
    for header in sorted(KERNEL_SRC.glob("*/config.cuh")):
        source = header.parent / "flash_fwd.cu"
        if source.is_file():
            return str(source.relative_to(KERNEL_SRC)), str(header.relative_to(KERNEL_SRC))
    pytest.skip("no kernel family under kernel_src/ yet")


def toy_space_text(
    *, name: str = "toy", block_m=(32, 64, 128), block_n=(32, 64, 128), stages=(1, 2, 3), flag=(0, 1)
) -> str:
    source, header = real_kernel_files()
    return f'''
[family]
name = "{name}"
description = "a toy family for tests"
source = "{source}"
config_header = "{header}"
entry = "toy_fwd"
abi = "flat"
min_arch = 80
head_dims = [64, 128]
dtypes = ["fp16", "bf16"]

[launch]
threads = "num_warps * 32"
smem_bytes = "smem_bytes"
grid = ["ceil_div(seqlen_q, block_m)", "heads_q", "batch"]

[knobs.block_m]
macro = "FT_BLOCK_M"
values = {list(block_m)}
default = 64
help = "query rows per CTA"

[knobs.block_n]
macro = "FT_BLOCK_N"
values = {list(block_n)}
default = 64
help = "keys per tile"

[knobs.stages]
macro = "FT_KV_STAGES"
values = {list(stages)}
default = {2 if 2 in stages else stages[0]}
help = "K/V ring depth"

[knobs.flag]
macro = "FT_Q_IN_REGS"
values = {list(flag)}
default = 0
help = "a boolean knob"

[derived.num_warps]
expr = "block_m // 16"
help = "warps per CTA"

[derived.smem_bytes]
expr = "(block_m + 2 * stages * block_n) * head_dim * dtype_bytes"
macro = "FT_SMEM_BYTES"
help = "dynamic shared memory"

[constraints.smem_fits]
expr = "smem_bytes <= smem_per_block_optin"
message = "needs {{smem_bytes}} B of shared memory; the device allows {{smem_per_block_optin}} B"
'''


@pytest.fixture
def toy_path(tmp_path) -> Path:
    path = tmp_path / "spaces" / "toy.toml"
    path.parent.mkdir()
    path.write_text(toy_space_text())
    return path


@pytest.fixture
def toy_space(toy_path):
    from tuner.space import load_space

    return load_space(toy_path)


@pytest.fixture
def problem() -> Problem:
    return Problem(batch=2, seqlen_q=512, heads_q=4, head_dim=128)


@pytest.fixture
def sm80():
    return limits_for_arch(80)


def pytest_configure(config):
    # flashtune turns on Optuna's (experimental) heartbeats and offers its BruteForceSampler on purpose
    config.addinivalue_line("filterwarnings", "ignore::optuna.exceptions.ExperimentalWarning")


@contextlib.contextmanager
def fast_dir():
    """A scratch folder in RAM where there is one (SQLite commits there skip the disk's fsync)."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    directory = Path(tempfile.mkdtemp(prefix="flashtune-test-", dir=base))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def sqlite_url():
    """URL of a fresh SQLite study database."""
    with fast_dir() as directory:
        yield f"sqlite:///{directory}/studies.db"


@pytest.fixture(scope="module")
def postgres():
    """A throwaway PostgreSQL server for a test module (tests/pg_server.py; some tests stop it), or a skip
    saying why there is none."""
    pytest.importorskip("psycopg")
    from tests.pg_server import PostgresServer, PostgresUnavailable

    try:
        server = PostgresServer()
    except PostgresUnavailable as e:
        pytest.skip(f"no PostgreSQL server: {e}")
    yield server
    server.close()
