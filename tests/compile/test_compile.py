"""tuner.compile: nvcc builds, the cubin cache and its key, failures (needs nvcc, not a GPU)."""

from __future__ import annotations

import contextlib
import errno
import shutil
import subprocess
from pathlib import Path

import pytest

import tuner.compile._nvcc as compile_mod
import tuner.space._space as space_mod
from tests.conftest import family_params
from tuner.compile import CompileError, cache_dir, compile_config, nvcc_options
from tuner.devices import limits_for_arch
from tuner.problem import Problem
from tuner.space import load_space

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")

# ---- the real families' defaults ---------------------------------------------------------------------------


def _default_builds():
    for param in family_params():
        path = param.values[0]
        if path is None:
            yield param
            continue
        try:
            space = load_space(path)
        except space_mod.SpaceError:  # reported by the test itself, not as a collection error
            yield pytest.param(path, 80, id=f"{path.stem}-broken")
            continue
        archs = [
            a
            for a in (80, 90)
            if a >= space.family.min_arch and (not space.family.arch_suffix or a == space.family.min_arch)
        ]
        for arch in archs:
            yield pytest.param(path, arch, id=f"{path.stem}-sm{arch}")


@pytest.mark.slow
@pytest.mark.parametrize(("space_path", "arch"), list(_default_builds()))
def test_default_config_compiles_without_spills(space_path, arch):
    space = load_space(space_path)
    problem = Problem(batch=1, seqlen_q=128, heads_q=1, head_dim=max(space.family.head_dims))
    kernel = compile_config(space, space.defaults(problem.head_dim), problem, limits_for_arch(arch))
    assert Path(kernel.cubin_path).is_file() and Path(kernel.cubin_path).stat().st_size > 0
    assert kernel.arch == space.arch_string(arch)
    assert kernel.entry == space.family.entry
    assert 0 < kernel.resources.registers <= 255
    assert not kernel.resources.spills, kernel.resources
    assert f"-DFT_HEAD_DIM={problem.head_dim}" in kernel.options


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("FLASHTUNE_CACHE_DIR", str(directory))
    return directory


def _any_family():
    for name in ("sm80", "sm90"):
        try:
            return load_space(name)
        except space_mod.SpaceError:
            continue
    pytest.skip("no kernel family yet")


def test_second_compile_is_served_from_cache(cache):
    space = _any_family()
    problem = Problem(batch=1, seqlen_q=128, heads_q=1, head_dim=min(space.family.head_dims))
    device = limits_for_arch(space.family.min_arch)
    first = compile_config(space, space.defaults(), problem, device)
    assert not first.cached and first.seconds > 0
    assert Path(first.cubin_path).parent == cache / "cubins"
    second = compile_config(space, space.defaults(), problem, device)
    assert second.cached and second.seconds == 0.0
    assert second.cubin_path == first.cubin_path
    assert second.resources == first.resources
    assert second.options == first.options
    again = compile_config(space, space.defaults(), problem, device, use_cache=False)
    assert not again.cached and again.cubin_path == first.cubin_path
    assert sorted(p.suffix for p in (cache / "cubins").iterdir()) == [".cubin", ".json"]  # no temp files left


# ---- a tiny family under a temporary kernel_src, for cheap compiles ------------------------------------------

TINY_SPACE = """
[family]
name = "tiny"
source = "tiny/kernel.cu"
config_header = "tiny/config.cuh"
entry = "tiny_fwd"
abi = "flat"
min_arch = 80
head_dims = [64]
dtypes = ["fp16"]

[launch]
threads = "128"
smem_bytes = "0"
grid = ["1", "1", "1"]

[knobs.width]
macro = "FT_WIDTH"
values = [1, 2, 4]
default = 1
help = "elements per thread"

[knobs.refuse]
macro = "FT_REFUSE"
values = [0, 1]
default = 0
help = "1: the header refuses to compile"
"""

TINY_HEADER = """#pragma once
#ifndef FT_WIDTH
#define FT_WIDTH 1
#endif
#ifndef FT_REFUSE
#define FT_REFUSE 0
#endif
#if FT_REFUSE
#error "tiny: FT_REFUSE=1 is not a valid config"
#endif
constexpr int kWidth = FT_WIDTH;
"""

TINY_KERNEL = """#include "tiny/config.cuh"
extern "C" __global__ void tiny_fwd(float* x) {
#pragma unroll
  for (int i = 0; i < kWidth; ++i) x[threadIdx.x * kWidth + i] *= 2.0f;
}
"""


@pytest.fixture
def tiny(tmp_path, monkeypatch, cache):
    src = tmp_path / "kernel_src"
    (src / "tiny").mkdir(parents=True)
    (src / "tiny" / "config.cuh").write_text(TINY_HEADER)
    (src / "tiny" / "kernel.cu").write_text(TINY_KERNEL)
    monkeypatch.setattr(space_mod, "KERNEL_SRC", src)
    monkeypatch.setattr(compile_mod, "KERNEL_SRC", src)
    path = tmp_path / "spaces" / "tiny.toml"
    path.parent.mkdir()
    path.write_text(TINY_SPACE)
    return load_space(path), src


PROBLEM = Problem(batch=1, seqlen_q=64, heads_q=1, head_dim=64)
SM80 = limits_for_arch(80)


def test_tiny_compiles(tiny):
    space, _ = tiny
    kernel = compile_config(space, space.defaults(), PROBLEM, SM80)
    assert kernel.entry == "tiny_fwd" and kernel.arch == "80"
    assert Path(kernel.cubin_path).read_bytes()[:4] == b"\x7fELF"
    assert kernel.resources.registers > 0 and not kernel.resources.spills
    assert kernel.to_dict()["resources"] == kernel.resources.to_dict()


def test_different_config_problem_or_arch_compiles_to_a_different_path(tiny):
    space, _ = tiny
    base = compile_config(space, {"width": 1, "refuse": 0}, PROBLEM, SM80).cubin_path
    other_config = compile_config(space, {"width": 4, "refuse": 0}, PROBLEM, SM80)
    causal = compile_config(
        space, {"width": 1, "refuse": 0}, Problem(batch=1, seqlen_q=64, heads_q=1, head_dim=64, causal=True), SM80
    )
    other_arch = compile_config(space, {"width": 1, "refuse": 0}, PROBLEM, limits_for_arch(90))
    paths = {base, other_config.cubin_path, causal.cubin_path, other_arch.cubin_path}
    assert len(paths) == 4
    assert not other_config.cached and "-DFT_WIDTH=4" in other_config.options
    assert other_arch.arch == "90"
    # shape and batch are runtime arguments: they do not change the cubin
    bigger = Problem(batch=8, seqlen_q=4096, heads_q=16, head_dim=64)
    same = compile_config(space, {"width": 1, "refuse": 0}, bigger, SM80)
    assert same.cached and same.cubin_path == base


def test_edited_kernel_source_changes_the_key(tiny):
    space, src = tiny
    before = compile_config(space, space.defaults(), PROBLEM, SM80)
    header = src / "tiny" / "config.cuh"
    header.write_text(header.read_text() + "// an edit\n")
    after = compile_config(space, space.defaults(), PROBLEM, SM80)
    assert not after.cached
    assert after.cubin_path != before.cubin_path
    (src / "tiny" / "new_file.cuh").write_text("// a new file, never included\n")
    assert compile_config(space, space.defaults(), PROBLEM, SM80).cached  # the key covers what is compiled
    header.write_text(header.read_text() + '#include "tiny/new_file.cuh"\n')
    assert not compile_config(space, space.defaults(), PROBLEM, SM80).cached
    (src / "tiny" / "new_file.cuh").write_text("// the included file, edited\n")
    assert not compile_config(space, space.defaults(), PROBLEM, SM80).cached


def test_config_that_nvcc_rejects_raises_compile_error(tiny):
    space, _ = tiny
    with pytest.raises(CompileError) as info:
        compile_config(space, {"width": 2, "refuse": 1}, PROBLEM, SM80)
    message = str(info.value)
    assert "tiny" in message and "refuse" in message
    assert "error" in message.lower()
    assert "FT_REFUSE=1 is not a valid config" in info.value.log
    assert "\n" not in message


def test_compile_outcome_turns_failure_into_a_status(tiny):
    from tuner.compile import compile_outcome

    space, _ = tiny
    bad = compile_outcome(str(space.path), {"width": 1, "refuse": 1}, PROBLEM, SM80)
    assert bad.status == "compile_error" and bad.payload is None and "error" in bad.reason.lower()
    good = compile_outcome(str(space.path), {"width": 1, "refuse": 0}, PROBLEM, SM80)
    assert good.status == "ok" and good.payload is not None and good.reason == ""


def test_unwritable_cache_still_compiles_with_a_warning(tiny, tmp_path, monkeypatch, capsys):
    space, _ = tiny
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("FLASHTUNE_CACHE_DIR", str(blocker / "cache"))  # mkdir fails even as root
    kernel = compile_config(space, space.defaults(), PROBLEM, SM80)
    warned = capsys.readouterr().err.splitlines()
    assert len(warned) == 1 and warned[0].startswith("flashtune: warning: cubin cache at "), warned
    try:
        assert not kernel.cached
        assert Path(kernel.cubin_path).is_file() and Path(kernel.cubin_path).read_bytes()[:4] == b"\x7fELF"
        assert kernel.resources.registers > 0
        again = compile_config(space, space.defaults(), PROBLEM, SM80)
        assert capsys.readouterr().err.startswith("flashtune: warning: ")
        assert not again.cached
        Path(again.cubin_path).unlink()
    finally:
        Path(kernel.cubin_path).unlink(missing_ok=True)
    assert blocker.read_text() == "not a directory"


def test_missing_nvcc_raises_compile_error(tiny, monkeypatch):
    space, _ = tiny
    monkeypatch.setenv("NVCC", "/nonexistent/bin/nvcc")
    compile_mod._nvcc_version.cache_clear()
    try:
        with pytest.raises(CompileError, match="nvcc"):
            compile_config(space, space.defaults(), PROBLEM, SM80)
    finally:
        compile_mod._nvcc_version.cache_clear()


# ---- options and cache location ------------------------------------------------------------------------------


def test_nvcc_options_are_an_argument_list():
    options = nvcc_options({"FT_HEAD_DIM": 128, "FT_BLOCK_M": 64})
    assert isinstance(options, tuple) and all(isinstance(o, str) for o in options)
    assert options[:2] == ("-I", str(compile_mod.KERNEL_SRC))
    assert options[-2:] == ("-DFT_HEAD_DIM=128", "-DFT_BLOCK_M=64")
    assert "-Xptxas=-v" in options  # the resources come from ptxas' report


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHTUNE_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("FLASHTUNE_CACHE_DIR")
    assert cache_dir() == tmp_path / "xdg" / "flashtune"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "flashtune"


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs, filled up: a real ENOSPC. Needs the right to mount (root outside a locked container)."""
    mount = tmp_path / "full"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip() or done.returncode})")
    try:
        with contextlib.suppress(OSError):
            (mount / "filler").write_bytes(b"\0" * (1 << 20))
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)


def test_full_disk_for_the_cache_still_compiles_with_a_warning(tiny, full_disk, monkeypatch, capsys):
    space, _ = tiny
    monkeypatch.setenv("FLASHTUNE_CACHE_DIR", str(full_disk / "cache"))
    kernel = compile_config(space, space.defaults(), PROBLEM, SM80)
    assert "flashtune: warning: cubin cache at " in capsys.readouterr().err
    try:
        assert not kernel.cached and Path(kernel.cubin_path).read_bytes()[:4] == b"\x7fELF"
        assert not list((full_disk / "cache" / "cubins").glob("*.tmp"))  # no half-written entries left
    finally:
        Path(kernel.cubin_path).unlink(missing_ok=True)


def test_enospc_while_writing_the_cache_leaves_no_partial_entry(tiny, monkeypatch, tmp_path, capsys):
    """The same without mount rights: the disk fills between the cubin and its metadata."""
    space, _ = tiny
    monkeypatch.setenv("FLASHTUNE_CACHE_DIR", str(tmp_path / "cache"))
    real = Path.write_bytes

    def write_bytes(self, data):
        if self.name.endswith(".json.tmp") or ".json." in self.name:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    kernel = compile_config(space, space.defaults(), PROBLEM, SM80)
    assert "No space left" in capsys.readouterr().err
    monkeypatch.setattr(Path, "write_bytes", real)
    try:
        assert not kernel.cached
        again = compile_config(space, space.defaults(), PROBLEM, SM80)  # an entry without metadata is no hit
        assert not again.cached and again.resources == kernel.resources
    finally:
        if "flashtune-" in kernel.cubin_path:
            Path(kernel.cubin_path).unlink(missing_ok=True)
