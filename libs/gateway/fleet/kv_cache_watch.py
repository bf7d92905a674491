"""Each worker's prefix cache as its engine's KV events describe it (Worker.WatchKvCache).

One stream per worker endpoint, opened once the worker's info says how it hashes blocks
(WorkerInfo.kv_cache_events). The endpoint's `cached_blocks` is the set its first message (a
snapshot) and every later change build; the routing policy kv_events reads it
(routing/kv_events.py). How stale it can be:
- while the stream is open, by the events' own delay (an engine step, then one message);
- when the stream fails (the worker exits or restarts, its connection drops), not at all:
  the set is dropped at once and the worker counts as caching nothing until a new stream's
  snapshot arrives;
- when the worker's host vanishes without closing the connection, by gRPC's keepalive (10 s,
  then 5 s for the answer: libs/rpc/options.py), after which the stream fails.
A worker without the RPC (an older worker, or one whose engine publishes no events) is left
out: routing sees no cache there, as with any worker it knows nothing about.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import grpc
import grpc.aio
import structlog

from cleave.worker.v1 import worker_pb2
from libs.kvevents.cached_blocks import CachedBlocks, KvCacheUpdate
from libs.kvevents.hashing import BlockHasher

if TYPE_CHECKING:
    from libs.gateway.fleet.pool import Endpoint

log = structlog.get_logger(__name__)


async def watch_kv_cache(endpoint: Endpoint, retry_s: float = 1.0) -> None:
    """Keeps `endpoint.cached_blocks` current for ever (cancel the task to stop)."""
    while True:
        info = endpoint.info
        if info is None:  # asked at the pool's next poll
            await asyncio.sleep(retry_s)
            continue
        if not info.HasField("kv_cache_events"):
            log.info(
                "worker publishes no KV cache events; kv_events routing sees no cache there",
                address=endpoint.address,
            )
            return
        hashing = info.kv_cache_events
        endpoint.kv_hasher = BlockHasher(hashing.block_size, hashing.hash_algo, hashing.none_hash_seed)
        try:
            await _follow(endpoint)
            lost = "the stream ended"
        except grpc.aio.AioRpcError as error:
            if error.code() in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.FAILED_PRECONDITION):
                log.info("worker serves no KV cache events", address=endpoint.address, reason=error.details())
                endpoint.cached_blocks = None
                return
            lost = error.code().name
        endpoint.cached_blocks = None
        log.debug("kv cache watch ended", address=endpoint.address, reason=lost)
        await asyncio.sleep(retry_s)


async def _follow(endpoint: Endpoint) -> None:
    blocks = CachedBlocks()
    async for message in endpoint.stub.WatchKvCache(worker_pb2.WatchKvCacheRequest()):
        for update in message.updates:
            blocks.apply(
                KvCacheUpdate(
                    stored=tuple(update.stored), removed=tuple(update.removed), cleared=update.cleared
                )
            )
        endpoint.cached_blocks = blocks  # from the first message (the snapshot) on
