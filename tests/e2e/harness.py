"""Real Cleave services as child processes on loopback for end-to-end tests, started with
the same launcher as the gateway's local stack (libs/stack)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from libs.stack.launcher import Service, start_service, wait_ready
from libs.stack.process import child_environment

__all__ = ["Service", "child_env", "log_dir", "rss_mib", "start", "stop_all", "wait_healthy"]


def child_env() -> dict[str, str]:
    """The test's own import path, so `python -m ...` finds the same packages."""
    env = child_environment({})
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return env


def log_dir() -> Path:
    folder = Path(os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR", "/tmp")) / "service-logs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def start(name: str, module: str, config: Any) -> Service:
    """`python -m module` with `config` (its service's frozen config type) as flags."""
    return start_service(name, name, module, config, log_dir())


def stop_all(services: Iterable[Service]) -> None:
    """Stops them all at once: each worker's graceful drain and engine exit take seconds."""
    with ThreadPoolExecutor() as pool:
        list(pool.map(Service.stop, services))


async def wait_healthy(service: Service, timeout_s: float) -> None:
    await wait_ready([service], timeout_s)


def rss_mib(service: Service) -> float:
    """Resident memory of the service and all its children (vLLM's engine core, workers)."""
    return service.running.rss_bytes() / 2**20
