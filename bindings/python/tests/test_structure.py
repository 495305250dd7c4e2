"""The package's modules import each other in one direction only.

Every relative import counts, also those inside functions and under
``TYPE_CHECKING``: a module that imports one above it, even lazily, ties
the two together again. ``session`` is the top; the modules under it reach
it through the protocols in ``_handles``.
"""

import ast
import os
import subprocess
import sys
from typing import Dict, List, Set

import llminfer

PACKAGE_DIR = os.path.dirname(llminfer.__file__)


def _imports_of(path: str) -> Set[str]:
    """The package modules a file imports (relative imports only)."""
    with open(path, encoding="utf-8") as source:
        tree = ast.parse(source.read(), path)
    found: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:  # from . import a, b
                found.update(alias.name for alias in node.names)
    return found


def _graph() -> Dict[str, Set[str]]:
    modules = {name[:-3] for name in os.listdir(PACKAGE_DIR) if name.endswith(".py")}
    modules.discard("__init__")  # the package's front door imports everything
    return {
        name: _imports_of(os.path.join(PACKAGE_DIR, name + ".py")) & modules for name in modules
    }


def _cycle(graph: Dict[str, Set[str]]) -> List[str]:
    """One import cycle as a list of modules, or [] when there is none."""
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    path: List[str] = []

    def visit(name: str) -> List[str]:
        state[name] = 1
        path.append(name)
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        state[name] = 2
        return []

    for name in sorted(graph):
        if name not in state:
            found = visit(name)
            if found:
                return found
    return []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


def test_the_modules_import_in_one_direction() -> None:
    graph = _graph()
    assert "session" in graph and "request" in graph["session"]
    assert _cycle(graph) == [], "modules that import each other"


def test_no_module_imports_session() -> None:
    importers = sorted(name for name, deps in _graph().items() if "session" in deps)
    assert importers == []


def test_import_does_not_load_asyncio() -> None:
    code = "import sys, llminfer; print('asyncio' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "False"
