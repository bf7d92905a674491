"""gRPC adapter of the kvstore: messages in and out, store calls in worker threads.

KvStore's methods block (disk reads, Redis round trips), so each runs via asyncio.to_thread
and the event loop keeps streaming other calls. Bad chunks are counted in PutResponse, not
errors: a Put stream never dies halfway because one chunk was corrupt. Malformed requests
(a key that is not a key, no layout for Lookup) end the call with INVALID_ARGUMENT, through
libs.rpc.methods like every Cleave servicer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

import grpc
import grpc.aio

from cleave.common.v1 import common_pb2
from cleave.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from libs.kvstore.identity import InvalidKey
from libs.kvstore.metrics import Tier
from libs.kvstore.store import KvStore, PutOutcome, StoreStats
from libs.observability.logging import bind_request_id
from libs.rpc.errors import InvalidRequest
from libs.rpc.methods import Refusals, rpc_method, rpc_stream
from libs.rpc.server import ServiceBinding

SERVICE_NAME = kvstore_pb2.DESCRIPTOR.services_by_name["KvStore"].full_name
SERVICE = "kvstore"
TIER_TO_PB = {
    Tier.CPU: kvstore_pb2.TIER_CPU,
    Tier.DISK: kvstore_pb2.TIER_DISK,
    Tier.REMOTE: kvstore_pb2.TIER_REMOTE,
}
# Chunks handed to the store per call: its waits for disk and Redis overlap within a batch.
PUT_BATCH_CHUNKS = 8
PUT_BATCH_BYTES = 256 * 1024 * 1024
# The store's word for a malformed request (a key that is not a key): the caller's mistake.
REFUSALS: Refusals = {InvalidKey: InvalidRequest}


def _bind(metadata: common_pb2.RequestMetadata) -> None:
    if metadata.request_id:
        bind_request_id(metadata.request_id)


class KvStoreServicer(kvstore_pb2_grpc.KvStoreServicer):
    def __init__(self, store: KvStore) -> None:
        self._store = store

    @rpc_method(service=SERVICE, refusals=REFUSALS)
    async def Put(
        self, request_iterator: AsyncIterator[kvstore_pb2.PutRequest], context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.PutResponse:
        counts = dict.fromkeys(PutOutcome, 0)
        batch: list[kvstore_pb2.PutRequest] = []
        batch_bytes = 0
        async for request in request_iterator:
            _bind(request.metadata)
            batch.append(request)
            batch_bytes += len(request.chunk.kv.data)
            if len(batch) >= PUT_BATCH_CHUNKS or batch_bytes >= PUT_BATCH_BYTES:
                await self._put_batch(batch, counts)
                batch, batch_bytes = [], 0
        if batch:
            await self._put_batch(batch, counts)
        return kvstore_pb2.PutResponse(
            stored=counts[PutOutcome.STORED],
            skipped_existing=counts[PutOutcome.EXISTS],
            rejected=counts[PutOutcome.REJECTED],
        )

    async def _put_batch(self, batch: list[kvstore_pb2.PutRequest], counts: dict[PutOutcome, int]) -> None:
        # Consecutive messages usually share a layout; each run of one layout is one store call.
        runs: list[tuple[common_pb2.KvLayout, list[kvstore_pb2.KvChunk]]] = []
        for request in batch:
            if runs and runs[-1][0] == request.layout:
                runs[-1][1].append(request.chunk)
            else:
                runs.append((request.layout, [request.chunk]))
        for layout, chunks in runs:
            for outcome in await asyncio.to_thread(self._store.put, layout, chunks):
                counts[outcome] += 1

    @rpc_stream(service=SERVICE, refusals=REFUSALS)
    async def Get(
        self, request: kvstore_pb2.GetRequest, context: grpc.aio.ServicerContext
    ) -> AsyncGenerator[kvstore_pb2.GetResponse, None]:
        _bind(request.metadata)
        for key in request.keys:
            fetched = await asyncio.to_thread(self._store.get, key)
            if fetched is None:
                return  # a missing chunk ends the stream: later chunks are useless without it
            yield kvstore_pb2.GetResponse(chunk=fetched.chunk, tier=TIER_TO_PB[fetched.tier])

    @rpc_method(service=SERVICE, refusals=REFUSALS)
    async def Lookup(
        self, request: kvstore_pb2.LookupRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.LookupResponse:
        _bind(request.metadata)
        if not request.HasField("layout"):
            raise InvalidRequest("layout is required: keys depend on it")
        metadata = request.metadata
        lora = metadata.lora if metadata.HasField("lora") else None
        result = await asyncio.to_thread(
            self._store.lookup, request.token_ids, request.layout, metadata.cache_salt, lora
        )
        return kvstore_pb2.LookupResponse(
            matched_tokens=result.matched_tokens,
            chunks=[
                kvstore_pb2.ChunkLocation(key=key, tier=TIER_TO_PB[tier]) for key, tier in result.located
            ],
            keys=result.keys,
        )

    @rpc_method(service=SERVICE, refusals=REFUSALS)
    async def GetStats(
        self, request: kvstore_pb2.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.KvStoreStats:
        return stats_message(await asyncio.to_thread(self._store.stats))


def stats_message(stats: StoreStats) -> kvstore_pb2.KvStoreStats:
    return kvstore_pb2.KvStoreStats(
        tiers=[
            kvstore_pb2.TierStats(
                tier=TIER_TO_PB[status.tier],
                bytes_used=status.bytes_used,
                bytes_capacity=status.bytes_capacity,
                num_chunks=status.num_chunks,
                hits=status.counts.hits,
                misses=status.counts.misses,
                evictions=status.counts.evictions,
                bytes_in=status.counts.bytes_in,
                bytes_out=status.counts.bytes_out,
                available=status.available,
            )
            for status in stats.tiers
        ],
        chunks_rejected=stats.chunks_rejected,
    )


def binding(servicer: KvStoreServicer) -> ServiceBinding:
    return ServiceBinding(SERVICE_NAME, servicer, kvstore_pb2_grpc.add_KvStoreServicer_to_server)
