"""deploy/compose resolved by docker-compose (`config`), for the compose tests: the stacks,
their services by kind."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.service_flags import image_name
from tests.deploy.tools import tool

COMPOSE_DIR = Path(__file__).parent.parent.parent / "deploy" / "compose"
STACKS = ["pd", "1p1d", "2p1d", "1e1pd", "1e1p1d"]
# The encode stacks (an encoder, workers with --enable-mm-embeds) serve $CLEAVE_VLM_MODEL.
ENCODE_STACKS = ["1e1pd", "1e1p1d"]
TAG = "test-tag"
VLM = "/models/test-vlm"


def compose_binary() -> str:
    return tool("docker-compose", "docker-compose", "compose files not validated")


def run_compose(stack: str, *args: str, vlm: str | None = VLM) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("TEST_TMPDIR", "/tmp"),
        "CLEAVE_TAG": TAG,
        **({"CLEAVE_VLM_MODEL": vlm} if vlm is not None else {}),
    }
    return subprocess.run(
        [compose_binary(), "--file", str(COMPOSE_DIR / stack / "docker-compose.yml"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,  # seconds on an idle machine; CI machines can be very loaded
        check=False,
    )


@functools.cache
def compose(stack: str, *args: str) -> str:
    result = run_compose(stack, *args)
    assert result.returncode == 0, f"docker-compose {' '.join(args)} of {stack}: {result.stderr}"
    return result.stdout


def resolved(stack: str) -> dict[str, Any]:
    return yaml.safe_load(compose(stack, "config"))


INIT_IMAGE = "cleave-secrets"


def cleave_services(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Services running a Cleave service binary (not Redis, which runs from the kvstore image,
    nor the secrets init step)."""
    return {
        name: s
        for name, s in config["services"].items()
        if "entrypoint" not in s and image_name(s["image"]) != INIT_IMAGE
    }


def long_running(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every service but the one-shot init step."""
    return {name: s for name, s in config["services"].items() if image_name(s["image"]) != INIT_IMAGE}
