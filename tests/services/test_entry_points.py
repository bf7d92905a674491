"""The services layer's registry names every kind of service, each a module that exists and
has the `main` its `if __name__ == "__main__"` runs."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from libs.stack.entry_points import ServiceKind
from services.entry_points import ENTRY_POINTS


def test_every_kind_of_service_has_an_entry_point_with_a_main() -> None:
    for kind in ServiceKind:
        module = ENTRY_POINTS.module(kind)
        # Found, not imported: a worker's imports vLLM.
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, module
        tree = ast.parse(Path(spec.origin).read_text())
        functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert "main" in functions, module
