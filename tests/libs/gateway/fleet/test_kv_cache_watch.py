"""The gateway's view of each worker's prefix cache, from the real worker servicer's
WatchKvCache on loopback (a fake engine whose feed the test publishes to)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from libs.config.roles import Role
from libs.gateway.fleet.pool import Endpoint, WorkerPool
from libs.kvevents.cached_blocks import KvCacheUpdate
from libs.kvevents.hashing import BlockHasher
from libs.rpc.server import GrpcServer, ServerConfig
from libs.worker.config import WorkerConfig
from libs.worker.kv_cache_feed import KvCacheFeed
from libs.worker.service import WorkerService
from services.worker.servicer import WorkerServicer, binding
from tests.libs.worker.fake_engine import FakeEngine

pytestmark = pytest.mark.anyio

HASHER = BlockHasher(16, "sha256", "seed-7")


async def start_worker(feed: KvCacheFeed | None, port: int = 0) -> GrpcServer:
    engine = FakeEngine()
    engine.kv_cache_feed = feed
    config = WorkerConfig(role=Role.BOTH, model="/nonexistent", served_model_name="fake")
    server = GrpcServer(
        ServerConfig(port=port, shutdown_grace_s=0), [binding(WorkerServicer(WorkerService(config, engine)))]
    )
    await server.start()
    return server


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110 (the gateway keeps plain fields, no event)
            await asyncio.sleep(0.01)


def holds(endpoint: Endpoint, *keys: int) -> bool:
    return endpoint.cached_blocks is not None and all(k in endpoint.cached_blocks for k in keys)


async def test_the_gateway_sees_what_the_engine_caches_and_forgets_it_when_the_worker_restarts() -> None:
    feed = KvCacheFeed(HASHER)
    feed.publish([KvCacheUpdate(stored=(1, 2))])  # cached before the gateway connected
    server = await start_worker(feed)
    pool = WorkerPool({Role.BOTH: [server.address]}, poll_interval_s=0.05, watch_kv_cache=True)
    await pool.start()
    [endpoint] = pool.endpoints
    try:
        await until(lambda: holds(endpoint, 1, 2))
        assert endpoint.kv_hasher == HASHER  # the worker's hashing, from WorkerInfo
        feed.publish([KvCacheUpdate(removed=(1,)), KvCacheUpdate(stored=(3,))])
        await until(lambda: holds(endpoint, 3) and 1 not in endpoint.cached_blocks)  # type: ignore[operator]
        port = int(server.address.rsplit(":", 1)[1])
        await server.stop()
        await until(lambda: endpoint.cached_blocks is None)  # gone with the worker, not kept stale
        server = await start_worker(KvCacheFeed(HASHER), port)  # restarted: an empty cache
        await until(lambda: endpoint.cached_blocks is not None)
        assert len(endpoint.cached_blocks) == 0  # type: ignore[arg-type]
    finally:
        await pool.close()
        await server.stop()


async def test_a_worker_without_kv_events_is_left_out() -> None:
    server = await start_worker(None)
    pool = WorkerPool({Role.BOTH: [server.address]}, poll_interval_s=0.05, watch_kv_cache=True)
    await pool.start()
    [endpoint] = pool.endpoints
    try:
        await until(lambda: endpoint.info is not None)
        assert not endpoint.info.HasField("kv_cache_events")  # type: ignore[union-attr]
        await asyncio.sleep(0.2)
        assert endpoint.cached_blocks is None and endpoint.kv_hasher is None
    finally:
        await pool.close()
        await server.stop()
