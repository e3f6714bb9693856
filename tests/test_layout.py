"""The floor plan of ``tuner/``, held by tests: a package per concern, no import cycles, short functions,
and Optuna's private names in one module only.

Imports are read from the source (``ast``), those inside functions included: an import cycle hidden
in a function body is still a cycle.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TUNER = Path(__file__).resolve().parents[1] / "tuner"

#: the modules allowed at the top of ``tuner/`` besides its packages
TOP_LEVEL_LIMIT = 12
MAX_FUNCTION_LINES = 60
#: the one module that may name Optuna's private storage internals (an ``RDBStorage`` subclass)
OPTUNA_PRIVATE_HOME = TUNER / "study" / "_optuna_storage.py"
OPTUNA_PRIVATE = re.compile(r"optuna\.storages\._|\b_rdb\b|\._trial_id\b|(?<=\w)(?<!self)\._storage\b")


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(TUNER.rglob("*.py")):
        parts = list(path.relative_to(TUNER.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The tuner modules ``name`` imports, at any depth of its body."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in MODULES}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("tuner"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in MODULES else target)
    out.discard(name)
    return {m for m in out if m in MODULES}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (as a path that ends where it starts), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def test_no_import_cycle_between_modules():
    assert _cycle(GRAPH) is None, " -> ".join(_cycle(GRAPH) or [])


def test_packages_import_each_other_in_one_direction():
    packages: dict[str, set[str]] = {}
    for module, deps in GRAPH.items():
        if module == "tuner":  # the root only re-exports the public API
            continue
        packages.setdefault(_package(module), set()).update(
            _package(d) for d in deps if d != "tuner" and _package(d) != _package(module)
        )
    assert _cycle(packages) is None, " -> ".join(_cycle(packages) or [])


def test_few_modules_at_the_top():
    top = sorted(p.name for p in TUNER.glob("*.py"))
    assert len(top) <= TOP_LEVEL_LIMIT, top


def test_each_package_has_one_entrance():
    for init in sorted(TUNER.glob("*/__init__.py")):
        tree = ast.parse(init.read_text())
        names = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        assert "__all__" in names, f"{init.relative_to(TUNER.parent)} declares no __all__"
        assert ast.get_docstring(tree), f"{init.relative_to(TUNER.parent)} says nothing of its package"
        for module in init.parent.glob("*.py"):
            if module.name != "__init__.py":
                assert module.name.startswith("_"), (
                    f"{module.relative_to(TUNER.parent)}: a package's modules are private"
                )


def test_other_packages_use_an_entrance():
    """Outside its package, a package's private module is not imported (its ``__init__`` is the entrance)."""
    wrong = []
    for module, deps in GRAPH.items():
        for dep in deps:
            private = dep.split(".")[-1].startswith("_") and dep.count(".") >= 2
            if private and _package(dep) != _package(module) and not dep.endswith("._version"):
                wrong.append(f"{module} imports {dep}")
    assert not wrong, "\n".join(wrong)


def test_no_function_is_long():
    long = []
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(TUNER.parent)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "\n".join(long)


def test_optuna_private_names_stay_in_one_module():
    found = []
    for path in MODULES.values():
        if path == OPTUNA_PRIVATE_HOME:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if OPTUNA_PRIVATE.search(code):
                found.append(f"{path.relative_to(TUNER.parent)}:{number}: {line.strip()}")
    assert OPTUNA_PRIVATE_HOME.exists()
    assert not found, "\n".join(found)


@pytest.mark.parametrize("cycle_free", [{"a": {"b"}, "b": {"c"}, "c": set()}])
def test_the_cycle_finder_finds_cycles(cycle_free):
    assert _cycle(cycle_free) is None
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
