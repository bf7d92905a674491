"""Gateway processes for the fleet benchmarks: the first starts a local stack of mock workers,
the others (replicas, as behind a load balancer) serve the same workers and tokenizer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from libs.config.flags import render
from libs.config.groups import EngineKind
from libs.gateway.config import GatewayConfig
from libs.rpc.ports import read_port_file
from libs.stack import process as processes
from libs.stack.entry_points import ServiceKind
from libs.stack.topology import parse_mode
from services.entry_points import ENTRY_POINTS

Gateway = tuple[processes.RunningProcess, GatewayConfig]


def mock_stack_config(
    workers: int,
    profile: str,
    time_scale: float,
    port_file: Path,
    token_file: Path,
    cache_dir: Path,
    **flags: Any,
) -> GatewayConfig:
    """A gateway on 127.0.0.1 (any free port, written to `port_file`) whose local stack runs
    `workers` colocated mock workers, and `flags` besides."""
    return GatewayConfig(
        mode=parse_mode(f"{workers}pd"),
        host="127.0.0.1",
        port=0,
        port_file=port_file,
        engine=EngineKind.MOCK,
        mock_profile=profile,
        mock_time_scale=time_scale,
        mock_startup_s=0.0,
        cache_dir=cache_dir,
        grpc_token_file=token_file,
        **flags,
    )


def start_gateway(name: str, config: GatewayConfig, logs: Path) -> Gateway:
    spec = processes.ProcessSpec(
        name, processes.python_module(ENTRY_POINTS.module(ServiceKind.GATEWAY), render(config))
    )
    return processes.start(spec, logs), config


def wait_serving(process: processes.RunningProcess, config: GatewayConfig, timeout_s: float) -> str:
    """The gateway's base URL once it reported its port and says it is ready."""
    assert config.port_file is not None
    deadline = time.monotonic() + timeout_s
    while not config.port_file.exists() or not config.port_file.read_text().strip():
        if process.exit_code() is not None or time.monotonic() > deadline:
            raise process.failure("did not report its port")
        time.sleep(0.2)
    base = f"http://127.0.0.1:{config.port_file.read_text().strip()}"
    ready = replace(process, spec=replace(process.spec, health_url=f"{base}/ready"))
    asyncio.run(processes.wait_ready([ready], timeout_s))
    return base


def workers_of(base: str) -> list[str]:
    """The worker addresses a serving gateway routes to (its /health)."""
    health = httpx.get(f"{base}/health", timeout=30).json()
    return [str(w["address"]) for w in health["workers"]]


def replica_config(
    primary: GatewayConfig, port_file: Path, tokenizer: str, workers: Sequence[str], **flags: Any
) -> GatewayConfig:
    """Another gateway over the primary's local stack (the same colocated workers and tokenizer),
    with the primary's routing and security and `flags` besides."""
    return replace(
        GatewayConfig(),
        host="127.0.0.1",
        port=0,
        port_file=port_file,
        tokenizer=tokenizer,
        pd_workers=tuple(workers),
        routing=primary.routing,
        grpc_token_file=primary.grpc_token_file,
        **flags,
    )


def start_replicas(
    primary: Gateway, base: str, count: int, folder: Path, logs: Path, **flags: Any
) -> tuple[list[Gateway], list[str]]:
    """`count` more gateways over the primary's stack, serving; their processes and base URLs."""
    process, config = primary
    workers = workers_of(base)
    tokenizer_port = read_port_file(config.log_dir / f"tokenizer.{process.pid}.port")
    started = [
        start_gateway(
            f"gateway-{index}",
            replica_config(
                config, folder / f"gateway-{index}.port", f"127.0.0.1:{tokenizer_port}", workers, **flags
            ),
            logs,
        )
        for index in range(1, count + 1)
    ]
    return started, [wait_serving(*g, 120) for g in started]
