"""KvStore with its Redis tier: restarts come back from Redis; a Redis outage is no error."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from libs.config.errors import ConfigError
from libs.kvstore.config import KvStoreConfig
from libs.kvstore.keys import engine_key
from libs.kvstore.metrics import Tier
from libs.kvstore.store import KvStore, PutOutcome, StoreStats, TierStatus
from tests.libs.kvstore.helpers import CHUNK_TOKENS, LAYOUT, StoreFactory, make_chunk, prompt, put_prompt
from tests.libs.kvstore.redis_server import RedisServer


def tier(stats: StoreStats, which: Tier) -> TierStatus:
    return next(status for status in stats.tiers if status.tier is which)


def test_a_restarted_store_gets_chunks_back_from_redis(
    make_store: StoreFactory, redis_server: RedisServer
) -> None:
    tokens = prompt(1, 2 * CHUNK_TOKENS + 3)
    before = make_store(redis_url=redis_server.url)
    chunks = put_prompt(before, tokens)
    assert tier(before.stats(), Tier.REMOTE).counts.bytes_in > 0
    before.close()  # memory gone; no disk tier

    after = make_store(redis_url=redis_server.url)
    result = after.lookup(tokens, LAYOUT)
    assert result.matched_tokens == len(tokens)
    assert [t for _, t in result.located] == [Tier.REMOTE] * 3
    fetched = [after.get(chunk.key) for chunk in chunks]
    assert [f.tier if f else None for f in fetched] == [Tier.REMOTE] * 3
    assert [f.chunk if f else None for f in fetched] == chunks
    again = after.get(chunks[0].key)  # promoted to memory
    assert again is not None and again.tier is Tier.CPU


def test_redis_down_memory_and_disk_keep_serving_without_errors(
    make_store: StoreFactory, redis_server: RedisServer, tmp_path: Path
) -> None:
    registry = CollectorRegistry()
    config = KvStoreConfig(
        cpu_bytes=64 * 1024,
        disk_dir=tmp_path / "disk",
        disk_bytes=1 << 20,
        redis_url=redis_server.url,
        chunk_tokens=CHUNK_TOKENS,
        remote_timeout_s=0.5,
        remote_probe_interval_s=0.2,
    )
    store = KvStore(config, registry=registry)
    try:
        stored = put_prompt(store, prompt(2, CHUNK_TOKENS))[0]
        assert tier(store.stats(), Tier.REMOTE).available

        redis_server.stop()
        time.sleep(0.3)  # past the probe interval: the next call probes and finds it down
        # Writes still land in memory and on disk, reads and lookups still answer.
        during = [make_chunk(k) for k in store.chunk_keys(prompt(3, CHUNK_TOKENS), LAYOUT)]
        assert store.put(LAYOUT, during) == [PutOutcome.STORED]
        for chunk in (stored, during[0]):
            fetched = store.get(chunk.key)
            assert fetched is not None and fetched.chunk == chunk
        assert store.lookup(prompt(3, CHUNK_TOKENS), LAYOUT).matched_tokens == CHUNK_TOKENS
        assert store.get(store.chunk_keys(prompt(4, 8), LAYOUT)[0]) is None  # a plain miss

        stats = store.stats()
        assert not tier(stats, Tier.REMOTE).available
        assert registry.get_sample_value("cleave_kvstore_tier_available", {"tier": "remote"}) == 0
        errors = sum(
            registry.get_sample_value("cleave_kvstore_remote_errors_total", {"op": op}) or 0
            for op in ("ping", "exists", "get", "put")
        )
        assert errors >= 1
    finally:
        store.close()


def test_redis_coming_back_is_used_again(make_store: StoreFactory, tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        store = make_store(redis_url=server.url, remote_timeout_s=0.5)
        server.stop()
        time.sleep(0.3)
        assert not tier(store.stats(), Tier.REMOTE).available
        server = RedisServer(tmp_path / "redis", port=server.port).start()  # Redis is back
        time.sleep(0.3)
        assert tier(store.stats(), Tier.REMOTE).available
        chunk = put_prompt(store, prompt(5, CHUNK_TOKENS))[0]
        with server.client() as client:
            assert client.exists(engine_key(chunk.key).to_string() + "kv_bytes")
    finally:
        server.stop()


def test_a_corrupt_value_in_redis_is_rejected_and_deleted(
    make_store: StoreFactory, redis_server: RedisServer
) -> None:
    before = make_store(redis_url=redis_server.url)
    chunk = put_prompt(before, prompt(6, CHUNK_TOKENS))[0]
    before.close()
    name = engine_key(chunk.key).to_string()
    with redis_server.client() as client:
        value = bytearray(client.get(name + "kv_bytes"))
        value[-1] ^= 0x01
        client.set(name + "kv_bytes", bytes(value))
        after = make_store(redis_url=redis_server.url)
        assert after.get(chunk.key) is None
        assert after.stats().chunks_rejected == 1
        assert not client.exists(name + "kv_bytes")


def test_a_redis_with_a_password_is_used_with_the_password_file_only(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    server = RedisServer(tmp_path / "locked", password="p@ss/word:1").start()
    try:
        password_file = tmp_path / "redis-password"
        password_file.write_text("p@ss/word:1\nan-older-one\n")  # the first line is used
        tokens = prompt(7, CHUNK_TOKENS)
        store = make_store(redis_url=server.url, redis_password_file=password_file)
        put_prompt(store, tokens)
        assert tier(store.stats(), Tier.REMOTE).counts.bytes_in > 0
        assert server.client().dbsize() > 0
        without = make_store(redis_url=server.url)  # Redis refuses it: the tier is down, not wrong
        assert without.lookup(tokens, LAYOUT).matched_tokens == 0
        assert not tier(without.stats(), Tier.REMOTE).available
        with pytest.raises(ConfigError, match="--redis-password-file"):
            make_store(redis_url=server.url, redis_password_file=tmp_path / "missing")
    finally:
        server.stop()
