"""Build an offline wheelhouse for an air-gapped GPU node: flashtune's wheel and every dependency.

On a machine with package-registry access::

    python -m tuner.wheelhouse wheelhouse/ --python-version 3.12
    # copy wheelhouse/ to the GPU node, then there:
    pip install --no-index --find-links wheelhouse/ flashtune

``--skip NAME`` leaves out packages the node already has (e.g. ``--skip cupy-cuda13x --skip numpy``
where CuPy and NumPy are installed), which keeps the copy small.
"""

from __future__ import annotations

import argparse
import platform
import re
import subprocess
import sys
from pathlib import Path

from .paths import REPO_ROOT

__all__ = ["build_wheelhouse", "main"]

PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def marker_mismatches(python_version: str, platforms: tuple[str, ...]) -> list[str]:
    """Where this machine differs from the node in what pip's dependency markers test.

    ``pip download --python-version/--platform`` picks wheels for the node, but evaluates markers
    such as ``python_version < "3.13"`` or ``sys_platform == "win32"`` for the interpreter running
    it, so a conditional dependency can be missed or added.
    """
    out = []
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if here != python_version:
        out.append(f"this Python is {here}, the node's {python_version}")
    if all("x86_64" in p for p in platforms) and (sys.platform != "linux" or platform.machine() != "x86_64"):
        out.append(f"this machine is {sys.platform} {platform.machine()}, the node Linux x86_64")
    return out


def build_wheelhouse(
    dest: Path,
    *,
    python_version: str = "3.12",
    platforms: tuple[str, ...] = PLATFORMS,
    skip: tuple[str, ...] = (),
    extras: str = "",
) -> list[Path]:
    for mismatch in marker_mismatches(python_version, platforms):
        print(
            f"warning: {mismatch}: pip evaluates dependency markers for this machine, so a dependency that is "
            "conditional on the Python version or platform may be missed; build with the node's Python on "
            "Linux x86_64 to be sure",
            file=sys.stderr,
        )
    if REPO_ROOT is None:
        raise SystemExit("run this from a flashtune checkout (it builds the wheel from the source tree)")
    dest.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "--no-deps", "--wheel-dir", str(dest), str(REPO_ROOT)], check=True)
    wheel = max(dest.glob("flashtune-*.whl"), key=lambda p: p.stat().st_mtime)
    target = [
        f"--python-version={python_version}",
        "--implementation=cp",
        "--only-binary=:all:",
        *(f"--platform={p}" for p in platforms),
    ]
    requirement = f"{wheel}[{extras}]" if extras else str(wheel)
    subprocess.run([*pip, "download", "--dest", str(dest), *target, requirement], check=True)
    skipped = {_normalize(s) for s in skip}
    kept = []
    for path in sorted(dest.glob("*.whl")):
        if _normalize(path.name.split("-")[0]) in skipped:
            path.unlink()
        else:
            kept.append(path)
    return kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tuner.wheelhouse", description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="folder to fill with wheels")
    parser.add_argument("--python-version", default="3.12", help="the GPU node's Python (default %(default)s)")
    parser.add_argument("--platform", action="append", help="pip platform tags (default: manylinux x86_64 family)")
    parser.add_argument("--skip", action="append", default=[], help="a package the node already has (repeatable)")
    parser.add_argument("--extras", default="", help="flashtune extras to include, e.g. postgres")
    args = parser.parse_args(argv)
    kept = build_wheelhouse(
        args.dest,
        python_version=args.python_version,
        platforms=tuple(args.platform) if args.platform else PLATFORMS,
        skip=tuple(args.skip),
        extras=args.extras,
    )
    size = sum(p.stat().st_size for p in kept) / 2**20
    print(f"{len(kept)} wheels, {size:.1f} MiB in {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
