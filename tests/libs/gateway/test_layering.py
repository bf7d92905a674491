"""The gateway's rooms keep their import rules (libs/gateway/BUILD.bazel), libs/ never imports
services/ (or tools/, tests/), and no module under libs/ is part of an import cycle.

Imports are read from the sources (ast), not by importing them: a rule broken anywhere fails
here even if no test imports that module. Only imports that run when a module is imported
count for cycles (module level, also under `if`/`try`); imports inside functions run later,
but they still count for the layering rules.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

RUNFILES = Path(os.environ.get("TEST_SRCDIR", "."), os.environ.get("TEST_WORKSPACE", "cleave"))
ROOMS = ("api", "serving", "fleet", "common")
# room -> the rooms it may import (itself always).
MAY_IMPORT = {
    "api": {"serving", "fleet", "common"},
    "serving": {"fleet", "common"},
    "fleet": {"common"},
    "common": set(),
}
FORBIDDEN_TOP = ("services", "tools", "tests")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(tree: ast.Module, module: str, is_package: bool, modules: set[str]) -> Iterator[tuple[str, bool]]:
    """(imported module, runs at import time) for every import in `tree`."""
    for node, in_function in _walk(tree, in_function=False):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, not in_function
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                yield (submodule if submodule in modules else base), not in_function


def _walk(node: ast.AST, *, in_function: bool) -> Iterator[tuple[ast.AST, bool]]:
    """Every node under `node`, and whether it sits inside a function's body."""
    for child in ast.iter_child_nodes(node):
        yield child, in_function
        inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        yield from _walk(child, in_function=inside)


def room_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] == ["libs", "gateway"] and len(parts) > 2 and parts[2] in ROOMS:
        return parts[2]
    return None


def violations(root: Path) -> list[str]:
    """Every broken rule under `root`/libs, one line each."""
    sources = {module_name(root, p): p for p in (root / "libs").rglob("*.py")}
    modules = set(sources)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    found = []
    for module, path in sorted(sources.items()):
        tree = ast.parse(path.read_text(), filename=str(path))
        room = room_of(module)
        for imported, at_import in imports(tree, module, path.name == "__init__.py", modules):
            if imported.split(".")[0] in FORBIDDEN_TOP:
                found.append(f"{module} imports {imported}: libs/ never imports {imported.split('.')[0]}/")
            target_room = room_of(imported)
            crossing = room is not None and target_room is not None and target_room != room
            if crossing and target_room not in MAY_IMPORT[room]:  # type: ignore[index]
                found.append(
                    f"{module} imports {imported}: the {room} room may not import the {target_room} room"
                )
            if room is not None and imported in (
                "libs.gateway.config",
                "libs.gateway.server",
                "libs.gateway.api_servers",
            ):
                found.append(f"{module} imports {imported}: no room imports the gateway's composition root")
            if at_import and imported in modules and imported != module:
                graph[module].add(imported)
    found.extend(f"import cycle: {' -> '.join(cycle)}" for cycle in cycles(graph))
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                ordered = sorted(component)
                components.append([*ordered, ordered[0]])

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_the_tree_keeps_every_rule() -> None:
    assert violations(RUNFILES) == []


def write(root: Path, module: str, source: str) -> None:
    path = root / (module.replace(".", "/") + ".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)


def test_each_kind_of_broken_rule_is_found(tmp_path: Path) -> None:
    write(tmp_path, "libs.gateway.fleet.pool", "from libs.gateway.serving import decode\n")
    write(tmp_path, "libs.gateway.serving.decode", "def f():\n    from libs.gateway.api import app\n")
    write(tmp_path, "libs.gateway.api.app", "import libs.gateway.server\n")
    write(tmp_path, "libs.gateway.server", "")
    write(tmp_path, "libs.stack.local", "from services.worker import main\n")
    write(tmp_path, "libs.a", "from libs import b\n")
    write(tmp_path, "libs.b", "from . import a\n")
    found = violations(tmp_path)
    assert len(found) == 5, found
    assert any("fleet room may not import the serving room" in line for line in found)
    assert any("serving room may not import the api room" in line for line in found)  # inside a function too
    assert any("composition root" in line for line in found)
    assert any("libs/ never imports services/" in line for line in found)
    assert "import cycle: libs.a -> libs.b -> libs.a" in found
    # An import inside a function is not an import-time cycle.
    write(tmp_path, "libs.b", "def f():\n    from libs import a\n")
    assert not any(line.startswith("import cycle") for line in violations(tmp_path))
