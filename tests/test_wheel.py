"""A wheel built from the repo carries kernel_src/ and search_spaces/ and works outside the checkout; both the
wheel and the editable install (``pip install -e .``) import as ``tuner`` and as ``flashtune``."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if built.returncode:
        pytest.fail(f"pip wheel failed: {built.stderr[-1500:]}")
    wheel = next(out.glob("flashtune-*.whl"))
    target = out / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return wheel, target


def test_wheel_contains_the_kernel_sources_and_spaces(installed):
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    for path in (
        "kernel_src/sm80/flash_fwd.cu",
        "kernel_src/sm80/config.cuh",
        "kernel_src/sm90/flash_fwd.cu",
        "search_spaces/sm80.toml",
        "search_spaces/sm90.toml",
    ):
        assert f"tuner/_data/{path}" in names
    assert not [n for n in names if n.startswith(("tests/", "scratch/"))]
    assert "flashtune/__init__.py" in names and "tuner/__init__.py" in names


#: run in a fresh interpreter: both import names, one set of module objects, files from where ``expect`` says
IMPORT_BOTH = """
import sys
import flashtune, flashtune.serve, tuner, tuner.serve
from flashtune import sdpa, attention, __version__
from flashtune.study import open_storage
import tuner.study
assert flashtune.serve is tuner.serve and sdpa is tuner.sdpa and attention is tuner.attention
assert open_storage is tuner.study.open_storage and flashtune.__version__ == tuner.__version__
assert sorted(flashtune.__all__) == sorted(tuner.__all__)
assert not [m for m in sys.modules if m.startswith("flashtune.") and sys.modules[m] is not sys.modules["tuner" + m[9:]]]
print(flashtune.__file__)
print(tuner.__file__)
"""


def _imports_from(root: Path, shown: subprocess.CompletedProcess) -> None:
    assert shown.returncode == 0, shown.stderr[-2000:]
    files = shown.stdout.split()
    assert len(files) == 2 and all(Path(f).resolve().is_relative_to(root.resolve()) for f in files), (files, root)


def test_installed_wheel_works_outside_the_checkout(installed, tmp_path):
    _, target = installed
    env = {**os.environ, "PYTHONPATH": str(target), "FLASHTUNE_CACHE_DIR": str(tmp_path / "cache")}
    code = (
        "import tuner, tuner.paths as p; from tuner.space import available_families; "
        "print(p.KERNEL_SRC); print(available_families())"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    )
    assert str(target) in shown.stdout and "['sm80', 'sm90']" in shown.stdout
    both = subprocess.run([sys.executable, "-c", IMPORT_BOTH], cwd=tmp_path, env=env, capture_output=True, text=True)
    _imports_from(target, both)
    checked = subprocess.run(
        [sys.executable, "-m", "tuner", "check", "--family", "sm80", "--samples", "1", "--jobs", "1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert checked.returncode == 0, checked.stdout[-1500:] + checked.stderr[-1500:]
    assert "check passed" in checked.stdout


def test_the_editable_install_imports_as_flashtune_too(tmp_path):
    """``pip install -e .`` (hatchling's editable wheel: a .pth naming the checkout) serves both names from it."""
    target = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), "-e", str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode:
        pytest.fail(f"pip install -e failed: {done.stderr[-1500:]}")
    assert list(target.glob("*.pth")), "the editable install wrote no .pth file"
    # a site directory as a virtual environment's site-packages is one (its .pth files read), put first
    code = (
        f"import site, sys; before = list(sys.path); site.addsitedir({str(target)!r}); "
        "sys.path[:] = [p for p in sys.path if p not in before] + before\n" + IMPORT_BOTH
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    shown = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    _imports_from(REPO, shown)
