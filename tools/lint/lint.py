"""Runs ruff (lint + format check) and mypy over the repository's Python code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# Top-level folders holding first-party Python code.
PYTHON_ROOTS = ["libs", "services", "tools", "tests"]


def ruff_binary() -> str:
    import ruff.__main__ as ruff_main

    return str(ruff_main.find_ruff_bin())


def generated_protos_dir() -> str:
    # The runfiles copy of //protos, where the generated *_pb2.pyi stubs live.
    # (Not Path.resolve(): that would follow the runfiles symlink back to the source tree.)
    workspace_root = Path(os.path.abspath(__file__)).parents[2]
    return str(workspace_root / "protos")


def main(argv: list[str]) -> int:
    fix = "--fix" in argv
    workspace = Path(os.environ.get("BUILD_WORKSPACE_DIRECTORY", Path.cwd()))
    roots = [r for r in PYTHON_ROOTS if (workspace / r).is_dir()]
    ruff = ruff_binary()
    steps = [
        [ruff, "check", *(["--fix"] if fix else []), *roots],
        [ruff, "format", *([] if fix else ["--check"]), *roots],
        [sys.executable, "-m", "mypy", *roots],
    ]
    env = {**os.environ, "MYPYPATH": generated_protos_dir()}
    failed = False
    for step in steps:
        print("+", " ".join(Path(step[0]).name if i == 0 else a for i, a in enumerate(step)), flush=True)
        failed |= subprocess.run(step, cwd=workspace, env=env, check=False).returncode != 0
    print("lint: FAILED" if failed else "lint: OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
