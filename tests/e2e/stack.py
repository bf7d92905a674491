"""Fixtures' building blocks: the default model, a worker or a whole one-command stack
started as real processes, with the flags a user would type."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil

from cleave.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from libs.config.flags import parse
from libs.gateway.config import GatewayConfig
from libs.models.resolve import resolve_model
from libs.rpc.channel import open_blocking_channel, open_channel
from libs.rpc.security import RpcSecurity
from libs.worker.config import WorkerConfig
from tests.e2e.harness import Service, log_dir, rss_mib, start

# Shared with `bazel run` on the same machine, so SmolLM2 is converted once per machine.
MODEL_CACHE = Path.home() / ".cache" / "cleave" / "models"

# The gateway's local stack secures its services with a gRPC token by default (a random one
# in a file of its own). Its stacks here get this one instead (--grpc-token-file), so that
# tests calling a child directly can send it; a service started without a token ignores it.
STACK_TOKEN = secrets.token_urlsafe(32)
STACK_SECURITY = RpcSecurity(token=STACK_TOKEN)


def stack_channel(address: str) -> grpc.aio.Channel:
    """A channel to a service of a test's stack, with the stack's token."""
    return open_channel(address, security=STACK_SECURITY)


def stack_blocking_channel(address: str) -> grpc.Channel:
    return open_blocking_channel(address, security=STACK_SECURITY)


def stack_token_file(folder: Path) -> Path:
    path = folder / "grpc-token"
    path.write_text(STACK_TOKEN)
    path.chmod(0o600)
    return path


def default_model_dir() -> Path:
    return resolve_model("smollm2", MODEL_CACHE, progress=False).path


def start_worker(role: str, model_dir: Path, *extra: str, name: str | None = None) -> Service:
    flags = ["--role", role, "--model", str(model_dir), "--max-model-len", "2048", *extra]
    return start(name or role, "services.worker.main", parse(WorkerConfig, flags))


def start_gateway_stack(
    mode: str, cache_dir: Path, *extra: str, dtype: str = "float32"
) -> tuple[Service, str]:
    """`services.gateway.main --mode MODE`: the gateway starts tokenizer and workers itself.

    float32 by default: SmolLM2's greedy answer to "What is the capital of France?" is a
    near-tie in bf16 (vLLM's bf16 kernels pick "L'Étoile..."; fp32 gives "The capital of
    France is Paris."), and tests compare greedy text. `dtype="auto"`: the users' default (bf16).
    """
    return start_gateway_stacks(StackSpec(mode, cache_dir, extra, dtype))[0]


@dataclass(frozen=True)
class StackSpec:
    """One `start_gateway_stack` call's arguments."""

    mode: str
    cache_dir: Path
    extra: tuple[str, ...] = ()
    dtype: str = "float32"


def start_gateway_stacks(*specs: StackSpec) -> list[tuple[Service, str]]:
    """`start_gateway_stack` for each spec, all at once (a stack whose workers fit on fewer
    cores than the machine has leaves the rest idle while it starts); in order."""
    started: list[tuple[StackSpec, Service]] = []
    try:
        for spec in specs:
            flags = ["--mode", spec.mode, "--port", "0", "--model", str(default_model_dir()), "--dtype", spec.dtype,
                     "--cache-dir", str(spec.cache_dir), "--grpc-token-file", str(stack_token_file(spec.cache_dir)),
                     *spec.extra]  # fmt: skip
            name = "gateway" if len(specs) == 1 else f"gateway-{spec.mode}"
            service = start(name, "services.gateway.main", parse(GatewayConfig, flags))
            _STACK_LOGS[service.process.pid] = spec.cache_dir / "logs"
            started.append((spec, service))
        ready = []
        for spec, service in started:
            base_url = service.wait_http_ready(900)
            print(
                f"local {spec.mode} stack ready after {service.ready_after_s:.1f} s, "
                f"RSS {rss_mib(service):.0f} MiB (all processes)"
            )
            ready.append((service, base_url))
        return ready
    except BaseException:
        for _, service in started:
            _stop_tree(service)
            keep_stack_logs(service)
        raise


# Suites about the gateway's own behaviour, which does not depend on what the model says, run on
# the mock engine (libs/mockengine): vLLM's scheduling and KV cache simulated with the CPU
# profile's step times, tokens that depend only on their context, no model loaded, no start-up
# wait. The tokenizer is SmolLM2's, as on a real stack.
MOCK_ENGINE = ("--engine", "mock", "--mock-profile", "cpu-smollm2", "--mock-startup-s", "0")


def start_mock_stack(mode: str, cache_dir: Path, *extra: str) -> tuple[Service, str]:
    """`start_gateway_stack` with every worker on the mock engine."""
    return start_gateway_stack(mode, cache_dir, *MOCK_ENGINE, *extra)


def stop_gateway_stack(service: Service) -> None:
    """SIGTERM the gateway; every process of its local stack must be gone afterwards."""
    alive = _stop_tree(service)
    keep_stack_logs(service)
    assert service.process.returncode == 0, f"gateway exited with {service.process.returncode}"
    assert not alive, f"the gateway left {len(alive)} processes of its stack running: {alive}"


# Each local stack's own log folder (the gateway writes its children's logs there).
_STACK_LOGS: dict[int, Path] = {}
# What is worth reading first when a stack misbehaved: Python's and vLLM's errors and warnings.
_PROBLEM = re.compile(r"Traceback|\[(error|warning|critical)|\b(ERROR|WARNING|CRITICAL)\b|Error:")
_PROBLEM_LINES = 25


def keep_stack_logs(service: Service) -> None:
    """Copies the stack's logs into the test's outputs (one folder per stack: the gateway's
    own log is overwritten by the next stack's) and prints each log's problem lines, which
    pytest shows with a failure: CI prints only its output, never the outputs' files."""
    folder = _STACK_LOGS.pop(service.process.pid, None)
    if folder is None or not folder.is_dir():
        return
    kept = log_dir() / folder.parent.name
    shutil.copytree(folder, kept, dirs_exist_ok=True)
    with contextlib.suppress(OSError):
        shutil.copy(service.running.log_path, kept / "gateway.log")
    for log_file in sorted(kept.glob("*.log")):
        lines = log_file.read_text(errors="replace").splitlines()
        problems = [line[:300] for line in lines if _PROBLEM.search(line)]
        if problems:
            print(f"--- {log_file.name}: {len(problems)} problem lines (last {_PROBLEM_LINES}) ---")
            print("\n".join(problems[-_PROBLEM_LINES:]))


def _stop_tree(service: Service) -> list[psutil.Process]:
    """Stops the gateway; kills (and returns) whatever of its process tree outlived it."""
    tree: list[psutil.Process] = []
    with contextlib.suppress(psutil.Error):
        tree = psutil.Process(service.process.pid).children(recursive=True)
    if service.process.poll() is None:
        service.process.send_signal(signal.SIGTERM)
        try:
            service.process.wait(60)
        except Exception:
            service.kill()
    _gone, alive = psutil.wait_procs(tree, timeout=10)
    for process in alive:
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return list(alive)


async def stored_chunks(kvstore_address: str, at_least: int, timeout_s: float = 20.0) -> int:
    """Chunks in the kvstore's CPU tier, once there are `at_least` (saving is asynchronous)."""
    deadline = time.monotonic() + timeout_s
    async with stack_channel(kvstore_address) as channel:
        stub = kvstore_pb2_grpc.KvStoreStub(channel)
        while True:
            stats = await stub.GetStats(kvstore_pb2.GetStatsRequest())
            count = sum(t.num_chunks for t in stats.tiers if t.tier == kvstore_pb2.TIER_CPU)
            if count >= at_least or time.monotonic() > deadline:
                return count
            await asyncio.sleep(0.2)


def listening_ports(process: psutil.Process) -> set[int]:
    try:
        return {c.laddr.port for c in process.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
    except psutil.Error:  # e.g. a worker killed by an earlier test, not yet reaped
        return set()


def kill_worker(gateway: Service, address: str, sig: signal.Signals = signal.SIGKILL) -> None:
    """Signals the worker of the gateway's stack serving `address` and its vLLM engine
    processes (its process group: the local stack starts each child in its own)."""
    port = int(address.rsplit(":", 1)[1])
    for child in psutil.Process(gateway.process.pid).children():
        if port in listening_ports(child):
            os.killpg(child.pid, sig)
            return
    raise AssertionError(f"no worker process listens on {address}")
