"""Command-line conventions shared by the tools that may start a local stack."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def split_gateway_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the tool's arguments, the gateway's): the gateway's follow the first `--`."""
    argv = list(argv)
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1 :]
    return argv, []


def user_path(path: Path) -> Path:
    """A path as the user typed it: `bazel run` runs a tool inside the runfiles tree, and says
    in BUILD_WORKING_DIRECTORY where the user was."""
    base = os.environ.get("BUILD_WORKING_DIRECTORY")
    return Path(os.path.normpath(Path(base) / path)) if base and not path.is_absolute() else path
