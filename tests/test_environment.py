"""Every environment variable the code reads is documented in the README's table.

The code is read with ``ast``: a ``FLASHTUNE_*`` name counts as read where it is the argument of
``os.environ.get`` / ``os.getenv`` / ``os.environ[...]`` / ``... in os.environ``, or of a helper whose
name says it reads the environment (``_seconds_from_env``). Other ``FLASHTUNE_*`` strings (macros of
the headers, such as ``FLASHTUNE_FAMILY``) are not variables and are not asked for.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted([*(REPO / "tuner").rglob("*.py"), *(REPO / "flashtune").rglob("*.py")])
NAME = re.compile(r"FLASHTUNE_[A-Z0-9_]+")


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def _reads_env(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in ("get", "pop", "setdefault") and _is_environ(func.value):
        return True
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name == "getenv" or "env" in name.lower().split("_")


def _names(node: ast.AST) -> set[str]:
    """The FLASHTUNE_ names written as string constants in ``node``."""
    return {
        n.value
        for n in ast.walk(node)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and NAME.fullmatch(n.value)
    }


def read_variables(sources=SOURCES) -> dict[str, str]:
    """``{name: "file:line"}`` of every FLASHTUNE_ variable the sources read."""
    found: dict[str, str] = {}
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            args: list[ast.AST] = []
            if isinstance(node, ast.Call) and _reads_env(node):
                args = list(node.args[:1])
            elif isinstance(node, ast.Subscript) and _is_environ(node.value):
                args = [node.slice]
            elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
                args = [node.left]
            for arg in args:
                for name in _names(arg):
                    found.setdefault(name, f"{path}:{node.lineno}")
    return found


def documented() -> set[str]:
    """The variables of the README's "Environment variables" table."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(FLASHTUNE_[A-Z0-9_]+)` \|", section, flags=re.M))


def test_every_variable_the_code_reads_is_in_the_readme():
    read = read_variables()
    assert {"FLASHTUNE_CACHE_DIR", "FLASHTUNE_DEBUG", "FLASHTUNE_HEARTBEAT_INTERVAL_S"} <= set(read)
    missing = {name: where for name, where in read.items() if name not in documented()}
    assert not missing, f"read but not in the README's table: {missing}"


def test_the_readme_lists_no_variable_the_code_does_not_read():
    assert documented() - set(read_variables()) == set()


def test_the_scan_finds_every_way_of_reading_a_variable(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "import os\nfrom os import environ, getenv\n"
        "a = os.environ.get('FLASHTUNE_A')\nb = os.getenv('FLASHTUNE_B', '1')\nc = os.environ['FLASHTUNE_C']\n"
        "d = 'FLASHTUNE_D' in os.environ\ne = _seconds_from_env('FLASHTUNE_E', 10)\nf = environ.get('FLASHTUNE_F')\n"
        "g = getenv('FLASHTUNE_G')\nh = defines.get('FLASHTUNE_FAMILY')\ni = '#define FLASHTUNE_X 1'\n"
    )
    assert set(read_variables([source])) == {f"FLASHTUNE_{c}" for c in "ABCDEFG"}
