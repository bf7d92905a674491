"""The command-line tools the deploy tests run: found on PATH, or the test is skipped with
the reason; under CI (CLEAVE_REQUIRE_DEPLOY_TOOLS=1, .bazelrc's `test:ci`) it fails instead,
so a CI machine without them cannot pass by skipping."""

from __future__ import annotations

import os
import shutil

import pytest

REQUIRED_ENV = "CLEAVE_REQUIRE_DEPLOY_TOOLS"


def tool(name: str, debian_package: str, what: str) -> str:
    binary = shutil.which(name)
    if binary is not None:
        return binary
    message = f"{name} is not installed (apt-get install {debian_package}, or tests/deploy/manifest_tools.sh): {what}"
    if os.environ.get(REQUIRED_ENV) == "1":
        pytest.fail(message)
    pytest.skip(message)
