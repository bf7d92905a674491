"""Fixtures' building blocks: the default model, a worker or a whole one-command stack
started as real processes, with the flags a user would type."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import grpc
import psutil

from cleave.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from libs.config.flags import parse
from libs.models.resolve import resolve_model
from libs.worker.config import WorkerConfig
from services.gateway.config import GatewayConfig
from tests.e2e.harness import Service, rss_mib, start

# Shared with `bazel run` on the same machine, so SmolLM2 is converted once per machine.
MODEL_CACHE = Path.home() / ".cache" / "cleave" / "models"


def default_model_dir() -> Path:
    return resolve_model("smollm2", MODEL_CACHE, progress=False).path


def start_worker(role: str, model_dir: Path, *extra: str, name: str | None = None) -> Service:
    flags = ["--role", role, "--model", str(model_dir), "--max-model-len", "2048", *extra]
    return start(name or role, "services.worker.main", parse(WorkerConfig, flags))


def start_gateway_stack(mode: str, cache_dir: Path, *extra: str) -> tuple[Service, str]:
    """`services.gateway.main --mode MODE`: the gateway starts tokenizer and workers itself.

    float32: SmolLM2's greedy answer to the France question is a near-tie in bf16 (vLLM's
    bf16 kernels pick "L'Étoile..."; fp32 gives "The capital of France is Paris.").
    """
    flags = ["--mode", mode, "--port", "0", "--model", str(default_model_dir()), "--dtype", "float32",
             "--cache-dir", str(cache_dir), *extra]  # fmt: skip
    service = start("gateway", "services.gateway.main", parse(GatewayConfig, flags))
    try:
        base_url = service.wait_http_ready(900)
    except BaseException:
        _stop_tree(service)
        raise
    print(
        f"local {mode} stack ready after {service.ready_after_s:.1f} s, RSS {rss_mib(service):.0f} MiB (all processes)"
    )
    return service, base_url


def stop_gateway_stack(service: Service) -> None:
    """SIGTERM the gateway; every process of its local stack must be gone afterwards."""
    alive = _stop_tree(service)
    assert service.process.returncode == 0, f"gateway exited with {service.process.returncode}"
    assert not alive, f"the gateway left {len(alive)} processes of its stack running: {alive}"


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
    async with grpc.aio.insecure_channel(kvstore_address) as channel:
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
