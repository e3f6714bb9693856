"""Where the kernel sources and space files live: beside the package in a checkout, inside it in a wheel."""

from __future__ import annotations

from pathlib import Path

__all__ = ["KERNEL_SRC", "REPO_ROOT", "SEARCH_SPACES"]

_PACKAGE = Path(__file__).resolve().parent
_BUNDLED = _PACKAGE / "_data"

if (_BUNDLED / "kernel_src").is_dir():  # installed from a wheel
    KERNEL_SRC = _BUNDLED / "kernel_src"
    SEARCH_SPACES = _BUNDLED / "search_spaces"
    REPO_ROOT: Path | None = None
else:  # a checkout (editable install or PYTHONPATH)
    REPO_ROOT = _PACKAGE.parent
    KERNEL_SRC = REPO_ROOT / "kernel_src"
    SEARCH_SPACES = REPO_ROOT / "search_spaces"
