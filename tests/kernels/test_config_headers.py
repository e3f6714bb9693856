"""The kernels' config headers check a config against the device it is built for (tuner/devices.py's
limits, passed as -D macros), their defaults for a build by hand are that table's values, and every
kernel source includes the others by their path under kernel_src/. Needs nvcc (and cpp), not a GPU."""

from __future__ import annotations

import dataclasses
import itertools
import re
import shutil
import subprocess

import pytest

from tests.conftest import compile_config_header, family_params, supported_archs
from tuner.devices import DEVICE_MACROS, limits_for_arch
from tuner.paths import KERNEL_SRC
from tuner.problem import Problem
from tuner.space import load_space

_NVCC = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
_CPP = pytest.mark.skipif(shutil.which("cpp") is None, reason="cpp (the C preprocessor) is not installed")
_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"\n]+)"', re.MULTILINE)


@pytest.fixture(params=family_params())
def space(request):
    return load_space(request.param)


def _config_over_the_table_limit(space, problem, device, bigger):
    """A config that only the shared-memory limits refuse on ``device`` and that ``bigger`` accepts: the
    default with up to three knobs changed."""
    default = space.defaults(problem.head_dim)
    changes = [(k.name, v) for k in space.knobs for v in k.values if v != default[k.name]]
    for changed in itertools.chain.from_iterable(itertools.combinations(changes, n) for n in (1, 2, 3)):
        config = {**default, **dict(changed)}
        if len(dict(changed)) != len(changed):
            continue
        reasons = space.violations(config, problem, device)
        names = {reason.split(":", 1)[0] for reason in reasons}
        if (
            "smem_fits" in names
            and names <= {"smem_fits", "smem_per_sm_fits"}
            and not space.violations(config, problem, bigger)
        ):
            return config
    pytest.fail(
        f"{space.name}: no config needs more shared memory than {device.smem_per_block_optin} B and fits "
        f"{bigger.smem_per_block_optin} B"
    )


@_NVCC
def test_the_config_header_checks_the_limits_it_is_given(space, tmp_path):
    """A device with more shared memory than the table's: the config the static check accepts for it compiles
    for it, and fails the header's static_assert with the table's limits (the same check, in C++)."""
    device = limits_for_arch(supported_archs(space)[0])
    extra = 64 * 1024
    bigger = dataclasses.replace(
        device, smem_per_block_optin=device.smem_per_block_optin + extra, smem_per_sm=device.smem_per_sm + extra
    )
    problem = Problem(batch=1, seqlen_q=128, heads_q=1, head_dim=max(space.family.head_dims))
    config = _config_over_the_table_limit(space, problem, device, bigger)
    arch = space.arch_string(device.arch)
    fits = compile_config_header(space, space.build_macros(config, problem, bigger), arch, tmp_path)
    assert fits.returncode == 0, fits.stderr[-3000:]
    refused = compile_config_header(space, space.build_macros(config, problem, device), arch, tmp_path)
    assert refused.returncode != 0 and "smem_fits" in refused.stderr, refused.stderr[-3000:]


def _hand_build_defaults(space, cuda_arch: int | None) -> dict[str, int]:
    """The device macros' values in ``config_header`` without -D flags, in the device pass of ``cuda_arch``
    (``__CUDA_ARCH__``) or in the host pass (None): the header's macros, preprocessed by cpp."""
    text = (KERNEL_SRC / space.family.config_header).read_text()
    text = re.sub(r"^\s*#\s*(include|pragma)\b.*$", "", text, flags=re.MULTILINE)  # system headers are not needed
    flags = [] if cuda_arch is None else [f"-D__CUDA_ARCH__={cuda_arch}"]
    out = subprocess.run(
        ["cpp", "-x", "c++", "-dM", *flags], input=text, capture_output=True, text=True, check=True, timeout=60
    ).stdout
    defined = dict(re.findall(r"^#define (FT_[A-Z0-9_]+) (\d+)$", out, re.MULTILINE))
    return {macro: int(defined[macro]) for macro in DEVICE_MACROS.values() if macro in defined}


@_CPP
def test_hand_build_defaults_are_the_device_table(space):
    """A build by hand (no -D) checks against tuner/devices.py's limits for the arch it compiles; the host pass,
    which has no arch, against limits no smaller than any of them (it must never refuse what a device accepts)."""
    host = _hand_build_defaults(space, None)
    assert host, f"{space.family.config_header} gives no device limit a default"
    for arch in supported_archs(space):
        table = limits_for_arch(arch).macros()
        defaults = _hand_build_defaults(space, arch * 10)
        assert set(defaults) == set(host)
        assert defaults == {macro: table[macro] for macro in defaults}, f"sm_{arch}"
        assert all(host[macro] >= value for macro, value in defaults.items()), f"sm_{arch}"


def _sources():
    return sorted(p for p in KERNEL_SRC.rglob("*") if p.suffix in {".cu", ".cuh", ".inc"})


def test_every_include_is_a_path_under_kernel_src():
    """One include style: ``#include "sm90/ptx/wgmma.cuh"``, the path under kernel_src/ (nvcc gets
    ``-I kernel_src``), never a path relative to the including file; a family includes itself and common/."""
    wrong = []
    for path in _sources():
        family = path.relative_to(KERNEL_SRC).parts[0]
        for include in _INCLUDE.findall(path.read_text()):
            if not (KERNEL_SRC / include).is_file() or include.split("/")[0] not in {family, "common"}:
                wrong.append(f'{path.relative_to(KERNEL_SRC)}: #include "{include}"')
    assert _sources() and not wrong, "\n".join(wrong)


@pytest.mark.parametrize("family", ["sm80", "sm90"])
def test_the_families_split_their_sources_alike(family):
    """The headers by concern that both families have (README: kernel_src/README.md)."""
    names = {p.name for p in (KERNEL_SRC / family).iterdir()}
    assert {
        "config.cuh",
        "pipeline.cuh",
        "smem_layout.cuh",
        "mainloop.cuh",
        "softmax.cuh",
        "mask.cuh",
        "epilogue.cuh",
        "flash_fwd.cu",
    } <= names
    assert "apply_mask" in (KERNEL_SRC / family / "mask.cuh").read_text()
    assert "apply_mask" not in (KERNEL_SRC / family / "softmax.cuh").read_text()
