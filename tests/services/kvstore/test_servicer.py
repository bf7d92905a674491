"""The kvstore gRPC API on a loopback server over a real KvStore (memory + disk tiers)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from cleave.common.v1 import common_pb2
from cleave.kvstore.v1 import kvstore_pb2 as pb
from cleave.kvstore.v1 import kvstore_pb2_grpc
from libs.kvstore.config import KvStoreConfig
from libs.kvstore.store import KvStore
from libs.rpc.channel import open_channel
from libs.rpc.server import GrpcServer, ServerConfig
from services.kvstore.servicer import KvStoreServicer, binding
from tests.libs.kvstore.helpers import BLOB_ALLOCATION, CHUNK_TOKENS, LAYOUT, make_chunk, prompt

pytestmark = pytest.mark.anyio


@pytest.fixture
def store(tmp_path: Path) -> Iterator[KvStore]:
    config = KvStoreConfig(
        cpu_bytes=16 * BLOB_ALLOCATION,
        disk_dir=tmp_path / "disk",
        disk_bytes=1 << 20,
        chunk_tokens=CHUNK_TOKENS,
    )
    store = KvStore(config, registry=CollectorRegistry())
    yield store
    store.close()


@pytest.fixture
async def stub(store: KvStore) -> AsyncIterator[kvstore_pb2_grpc.KvStoreStub]:
    server = GrpcServer(ServerConfig(shutdown_grace_s=1.0), [binding(KvStoreServicer(store))])
    await server.start()
    try:
        async with open_channel(server.address) as channel:
            yield kvstore_pb2_grpc.KvStoreStub(channel)
    finally:
        await server.stop()


def metadata(request_id: str = "req-1") -> common_pb2.RequestMetadata:
    return common_pb2.RequestMetadata(request_id=request_id, model="tiny")


async def put(stub: kvstore_pb2_grpc.KvStoreStub, chunks: list[pb.KvChunk]) -> pb.PutResponse:
    async def requests() -> AsyncIterator[pb.PutRequest]:
        for chunk in chunks:
            yield pb.PutRequest(metadata=metadata(), layout=LAYOUT, chunk=chunk)

    response: pb.PutResponse = await stub.Put(requests())
    return response


async def get(stub: kvstore_pb2_grpc.KvStoreStub, keys: list[pb.ChunkKey]) -> list[pb.GetResponse]:
    return [r async for r in stub.Get(pb.GetRequest(metadata=metadata(), keys=keys))]


async def test_lookup_put_lookup_get(stub: kvstore_pb2_grpc.KvStoreStub) -> None:
    tokens = prompt(1, 20 * CHUNK_TOKENS + 5)  # 21 chunks: more than one put batch
    first = await stub.Lookup(pb.LookupRequest(metadata=metadata(), token_ids=tokens, layout=LAYOUT))
    assert first.matched_tokens == 0 and not first.chunks
    assert [k.num_tokens for k in first.keys] == [CHUNK_TOKENS] * 20 + [5]
    chunks = [make_chunk(key) for key in first.keys]
    assert await put(stub, chunks) == pb.PutResponse(stored=21)
    assert await put(stub, chunks[-3:]) == pb.PutResponse(skipped_existing=3)  # in memory and on disk
    # The first chunks were evicted from memory (16 fit) but are on disk: put back in memory.
    assert await put(stub, chunks[:3]) == pb.PutResponse(stored=3)

    second = await stub.Lookup(pb.LookupRequest(token_ids=tokens, layout=LAYOUT))
    assert second.matched_tokens == len(tokens)
    assert [c.key for c in second.chunks] == list(first.keys)
    # Memory holds the 16 latest puts (chunks 0-2 and 8-20); chunks 3-7 are on disk only.
    assert [c.tier for c in second.chunks[:9]] == [pb.TIER_CPU] * 3 + [pb.TIER_DISK] * 5 + [pb.TIER_CPU]

    replies = await get(stub, list(first.keys))
    assert [r.chunk for r in replies] == chunks
    assert [r.tier for r in replies[:4]] == [pb.TIER_CPU] * 3 + [pb.TIER_DISK]


async def test_lookup_keys_and_matches_under_the_requests_cache_salt(
    stub: kvstore_pb2_grpc.KvStoreStub,
) -> None:
    tokens = prompt(7, 2 * CHUNK_TOKENS)

    async def lookup(salt: str) -> pb.LookupResponse:
        salted = pb.LookupRequest(
            metadata=common_pb2.RequestMetadata(cache_salt=salt), token_ids=tokens, layout=LAYOUT
        )
        return await stub.Lookup(salted)

    salted = await lookup("tenant-a")
    assert await put(stub, [make_chunk(key) for key in salted.keys]) == pb.PutResponse(stored=2)
    assert (await lookup("tenant-a")).matched_tokens == 2 * CHUNK_TOKENS
    assert (await lookup("tenant-b")).matched_tokens == 0
    assert (await lookup("")).matched_tokens == 0


async def test_get_stops_at_the_first_missing_chunk(stub: kvstore_pb2_grpc.KvStoreStub) -> None:
    keys = list((await stub.Lookup(pb.LookupRequest(token_ids=prompt(2, 48), layout=LAYOUT))).keys)
    chunks = [make_chunk(k) for k in keys]
    assert (await put(stub, [chunks[0], chunks[2]])).stored == 2
    replies = await get(stub, keys)
    assert [r.chunk for r in replies] == [chunks[0]]


async def test_bad_chunks_are_counted_not_fatal(stub: kvstore_pb2_grpc.KvStoreStub) -> None:
    keys = list((await stub.Lookup(pb.LookupRequest(token_ids=prompt(3, 32), layout=LAYOUT))).keys)
    good, corrupt = (make_chunk(k) for k in keys)
    corrupt.crc32c ^= 1
    assert await put(stub, [good, corrupt]) == pb.PutResponse(stored=1, rejected=1)
    stats = await stub.GetStats(pb.GetStatsRequest())
    assert stats.chunks_rejected == 1


async def test_stats_report_each_tier(stub: kvstore_pb2_grpc.KvStoreStub) -> None:
    keys = list((await stub.Lookup(pb.LookupRequest(token_ids=prompt(5, 16), layout=LAYOUT))).keys)
    await put(stub, [make_chunk(keys[0])])
    await get(stub, keys)
    stats = await stub.GetStats(pb.GetStatsRequest())
    by_tier = {t.tier: t for t in stats.tiers}
    assert set(by_tier) == {pb.TIER_CPU, pb.TIER_DISK}
    cpu = by_tier[pb.TIER_CPU]
    assert (cpu.num_chunks, cpu.hits, cpu.bytes_capacity, cpu.available) == (1, 1, 16 * BLOB_ALLOCATION, True)
    assert cpu.bytes_used == BLOB_ALLOCATION and cpu.bytes_in == cpu.bytes_out > 0
    assert by_tier[pb.TIER_DISK].num_chunks == 1


async def test_malformed_requests_are_invalid_argument(stub: kvstore_pb2_grpc.KvStoreStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as no_layout:
        await stub.Lookup(pb.LookupRequest(token_ids=[1, 2, 3]))
    assert no_layout.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as bad_token:
        await stub.Lookup(pb.LookupRequest(token_ids=[-5], layout=LAYOUT))
    assert bad_token.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as bad_key:
        await get(stub, [pb.ChunkKey(prefix_hash="abc", layout_fingerprint="def")])
    assert bad_key.value.code() == grpc.StatusCode.INVALID_ARGUMENT
