"""`--api-server-count N` (vLLM's flag): N gateway processes serving the HTTP API on one socket.

Why: one gateway process relays every token on one core. This process binds the address,
starts the local stack (unless given addresses), and runs N gateway processes, each given the
services' addresses and the listening socket (`--listen-fd`); the kernel hands each new
connection to one of them. Each is a whole gateway (its own pool, admission and routing
state): per-worker bounds hold across them as across gateway replicas, because the workers
enforce them (libs/worker/capacity.py) and report their counts to each. Their metrics go to
one folder (prometheus_client's multiprocess mode), so /metrics, whichever process answers,
counts all of them (libs/gateway/api/metrics_export.py). This process serves no HTTP itself.

A process that exits ends the gateway (the others are stopped, then the stack): whatever
supervises the gateway (compose, Kubernetes, systemd) restarts it whole.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import sys
import tempfile
from contextlib import AsyncExitStack, suppress
from dataclasses import replace

import structlog

from libs.config.flags import render
from libs.config.roles import Role
from libs.gateway.api.metrics_export import METRICS_DIR_ENV
from libs.gateway.config import GatewayConfig
from libs.stack.local import StackAddresses
from libs.stack.process import child_environment, python_module

log = structlog.get_logger(__name__)

# Time for the processes' own shutdown beyond their HTTP grace before they are killed.
STOP_MARGIN_S = 10.0


def process_config(config: GatewayConfig, addresses: StackAddresses, listen_fd: int) -> GatewayConfig:
    """One API process's config: the services this gateway started or was given, and the socket."""
    return replace(
        config,
        api_server_count=1,
        listen_fd=listen_fd,
        port_file=None,
        tokenizer=addresses.tokenizer,
        prefill_workers=tuple(addresses.workers.get(Role.PREFILL, ())),
        decode_workers=tuple(addresses.workers.get(Role.DECODE, ())),
        pd_workers=tuple(addresses.workers.get(Role.BOTH, ())),
        encoders=addresses.encoders,
        kvstore=False,  # started already, if at all: its address is below
        kvstore_address=addresses.kvstore,
    )


async def run_api_servers(
    config: GatewayConfig, addresses: StackAddresses, listener: socket.socket, module: str
) -> None:
    """Runs `config.api_server_count` gateway processes (`python -m module`) on `listener`
    until one exits (RuntimeError) or this task is cancelled (they are stopped)."""
    async with AsyncExitStack() as cleanup:
        metrics_dir = tempfile.mkdtemp(prefix="cleave-gateway-metrics-")
        cleanup.callback(shutil.rmtree, metrics_dir, ignore_errors=True)
        argv = python_module(module, render(process_config(config, addresses, listener.fileno())))
        env = child_environment({METRICS_DIR_ENV: metrics_dir})
        processes = []
        for _ in range(config.api_server_count):
            process = await asyncio.create_subprocess_exec(*argv, env=env, pass_fds=(listener.fileno(),))
            cleanup.push_async_callback(_stop, process, (config.http_shutdown_grace_s or 0) + STOP_MARGIN_S)
            processes.append(process)
        log.info("api servers started", count=len(processes), pids=[p.pid for p in processes])
        waits = {asyncio.ensure_future(p.wait()): p for p in processes}
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        exited = waits[next(iter(done))]
        raise RuntimeError(f"API server process {exited.pid} exited with code {exited.returncode}")


async def _stop(process: asyncio.subprocess.Process, timeout_s: float) -> None:
    if process.returncode is not None:
        return
    with suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), timeout_s)
    except TimeoutError:
        print(f"cleave gateway: API server {process.pid} did not stop; killing it", file=sys.stderr)
        with suppress(ProcessLookupError):
            process.kill()
        await process.wait()


def inherited_listener(fd: int) -> socket.socket:
    """The listening socket a parent passed on (--listen-fd); checked to be one."""
    listener = socket.socket(fileno=fd)
    if listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) != 1:
        raise RuntimeError(f"--listen-fd {fd} is not a listening socket")
    os.set_inheritable(fd, False)
    return listener
