"""Fixtures' building blocks: the default model, and a worker started as a real process."""

from __future__ import annotations

from pathlib import Path

from libs.models.resolve import resolve_model
from tests.e2e.harness import Service, free_port, start_module

# Shared with `bazel run` on the same machine, so SmolLM2 is converted once per machine.
MODEL_CACHE = Path.home() / ".cache" / "cleave" / "models"


def default_model_dir() -> Path:
    return resolve_model("smollm2", MODEL_CACHE, progress=False).path


def start_worker(role: str, model_dir: Path, *extra: str, name: str | None = None) -> Service:
    port = free_port()
    args = [
        "--role", role,
        "--model", str(model_dir),
        "--port", str(port),
        "--kv-port", str(free_port()),
        "--max-model-len", "2048",
        "--log-level", "info",
        *extra,
    ]  # fmt: skip
    return start_module(name or role, "services.worker.main", args, port)
