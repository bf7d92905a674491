"""The fleet, connected from worker addresses: the worker pool (with its health poller, DNS
discovery and Prometheus collector), and the facts of the model its workers serve, once a
first worker answers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass

import prometheus_client
import structlog

from cleave.worker.v1 import worker_pb2
from libs.config.roles import Role
from libs.gateway.fleet.breaker import BreakerConfig
from libs.gateway.fleet.discovery import WorkerDiscovery
from libs.gateway.fleet.facts import FleetFacts
from libs.gateway.fleet.pool import Endpoint, WorkerPool
from libs.gateway.fleet.worker_metrics import WorkerStatsCollector
from libs.rpc.security import RpcSecurity

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Fleet:
    pool: WorkerPool
    facts: FleetFacts
    # The first worker's own report (its KV layout keys the kvstore's chunks).
    first: worker_pb2.WorkerInfo


async def connect_fleet(
    cleanup: AsyncExitStack,
    workers: Mapping[Role, Sequence[str]],
    *,
    served_model: str = "",
    security: RpcSecurity | None = None,
    breaker: BreakerConfig | None = None,
    worker_dns_refresh_s: float = 0.0,
    wait_for_workers_s: float = 0.0,
    shared_streams: bool = True,
    watch_kv_cache: bool = False,
) -> Fleet:
    """Connects to the workers; everything opened is closed by `cleanup`. With
    `worker_dns_refresh_s` > 0 a worker host name stands for all its DNS addresses, looked up
    again that often (discovery.py); with 0 gRPC is given the addresses as they are.
    `wait_for_workers_s`: how long to wait for a first worker to answer (workers started
    beside the gateway, in compose or Kubernetes, may still be loading their model)."""
    if worker_dns_refresh_s > 0:
        pool = WorkerPool(
            {},
            security=security,
            breaker=breaker,
            shared_streams=shared_streams,
            watch_kv_cache=watch_kv_cache,
        )
        cleanup.push_async_callback(pool.close)
        discovery = WorkerDiscovery(pool, workers, refresh_s=worker_dns_refresh_s)
        cleanup.push_async_callback(discovery.close)
        await discovery.start()
    else:
        pool = WorkerPool(
            workers,
            security=security,
            breaker=breaker,
            shared_streams=shared_streams,
            watch_kv_cache=watch_kv_cache,
        )
        cleanup.push_async_callback(pool.close)
    collector = WorkerStatsCollector(pool)
    prometheus_client.REGISTRY.register(collector)
    cleanup.callback(prometheus_client.REGISTRY.unregister, collector)
    await pool.start()
    first = await _first_answering(pool, wait_for_workers_s)
    info = await first.stub.GetInfo(worker_pb2.GetInfoRequest())
    first.info = first.info or info
    return Fleet(pool, FleetFacts(pool, info, served_model), info)


async def _first_answering(pool: WorkerPool, wait_s: float, report_every_s: float = 10.0) -> Endpoint:
    """The first worker whose polls succeed; the pool's own polling brings them in."""
    started = time.monotonic()
    reported = started
    while True:
        first = next((e for e in pool.endpoints if e.healthy), None)
        if first is not None:
            return first
        now = time.monotonic()
        if now - started >= wait_s:
            raise RuntimeError(
                f"no worker answered within {wait_s:g} s; check the worker addresses "
                f"({', '.join(e.address for e in pool.endpoints) or 'none resolved'})"
            )
        if now - reported >= report_every_s:
            reported = now
            log.info("waiting for a worker to answer", seconds=round(now - started))
        await asyncio.sleep(0.5)
