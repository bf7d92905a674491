"""Stored KV others could touch: Redis entries we did not write, an auth key that tags every
chunk on disk and in Redis, and a private disk directory."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from cleave.kvstore.v1 import kvstore_pb2
from libs.kvstore.auth import ChunkSealer
from libs.kvstore.chunks import ChunkRejected, RejectReason, decode_blob, encode_blob
from libs.kvstore.config import KvStoreConfig
from libs.kvstore.identity import layout_fingerprint
from libs.kvstore.keys import ChunkKeyer, engine_key
from libs.kvstore.local_tiers import DISK_SUFFIX
from libs.kvstore.metrics import Tier
from libs.kvstore.store import KvStore
from tests.libs.kvstore.helpers import CHUNK_TOKENS, LAYOUT, StoreFactory, make_chunk, prompt, put_prompt
from tests.libs.kvstore.redis_server import RedisServer

KEY = b"0123456789abcdef-test-key"


def key_file(tmp_path: Path, key: bytes = KEY, name: str = "kv.key") -> Path:
    path = tmp_path / name
    path.write_bytes(key + b"\n")
    return path


def dropped(registry: CollectorRegistry, tier: Tier, reason: RejectReason) -> float:
    value = registry.get_sample_value(
        "cleave_kvstore_dropped_entries_total", {"tier": tier.value, "reason": reason.value}
    )
    return value or 0.0


def chunk_keys(count: int) -> list[kvstore_pb2.ChunkKey]:
    return ChunkKeyer(CHUNK_TOKENS).keys(
        prompt(9, count * CHUNK_TOKENS), layout_fingerprint(LAYOUT, CHUNK_TOKENS)
    )


def open_store(registry: CollectorRegistry, **config: object) -> KvStore:
    return KvStore(
        KvStoreConfig(cpu_bytes=64 * 1024, chunk_tokens=CHUNK_TOKENS, remote_probe_interval_s=0.2, **config),  # type: ignore[arg-type]
        registry=registry,
    )


# --- unreadable Redis entries -------------------------------------------------------------


@pytest.mark.parametrize(
    "metadata",
    [b"garbage", b"\xff" * 64],
    ids=["short", "undecodable"],
)
def test_an_undecodable_redis_entry_is_deleted_counted_and_the_tier_stays_up(
    redis_server: RedisServer, metadata: bytes
) -> None:
    registry = CollectorRegistry()
    writer = open_store(CollectorRegistry(), redis_url=redis_server.url)
    chunks = put_prompt(writer, prompt(1, 2 * CHUNK_TOKENS))
    writer.close()
    bad = engine_key(chunks[0].key).to_string()
    with redis_server.client() as client:
        client.set(bad + "metadata", metadata)
        store = open_store(registry, redis_url=redis_server.url)
        try:
            assert store.get(chunks[0].key) is None
            assert not client.exists(bad + "metadata") and not client.exists(bad + "kv_bytes")
            assert dropped(registry, Tier.REMOTE, RejectReason.MALFORMED) == 1
            # Not a Redis failure: the tier is still up and serves the good entry.
            assert registry.get_sample_value("cleave_kvstore_tier_available", {"tier": "remote"}) == 1
            fetched = store.get(chunks[1].key)
            assert fetched is not None and fetched.tier is Tier.REMOTE and fetched.chunk == chunks[1]
            assert not registry.get_sample_value("cleave_kvstore_remote_errors_total", {"op": "get"})
        finally:
            store.close()


def test_a_value_longer_than_its_metadata_says_is_dropped(redis_server: RedisServer) -> None:
    registry = CollectorRegistry()
    writer = open_store(CollectorRegistry(), redis_url=redis_server.url)
    chunk = put_prompt(writer, prompt(2, CHUNK_TOKENS))[0]
    writer.close()
    name = engine_key(chunk.key).to_string()
    with redis_server.client() as client:
        client.append(name + "kv_bytes", b"extra")
        store = open_store(registry, redis_url=redis_server.url)
        try:
            assert store.get(chunk.key) is None
            assert not client.exists(name + "kv_bytes")
            assert dropped(registry, Tier.REMOTE, RejectReason.MALFORMED) == 1
            assert store.stats().tiers[-1].available
        finally:
            store.close()


# --- authenticated chunks -----------------------------------------------------------------


def test_the_key_is_read_from_a_file_and_never_shown(tmp_path: Path) -> None:
    sealer = ChunkSealer.from_file(key_file(tmp_path))
    assert KEY.decode() not in repr(sealer)
    with pytest.raises(ValueError, match="at least 16 bytes") as short:
        ChunkSealer.from_file(key_file(tmp_path, b"tooshort", "a.key"))
    assert "tooshort" not in str(short.value)
    with pytest.raises(ValueError, match="cannot read"):
        ChunkSealer.from_file(tmp_path / "missing.key")


def test_tags_bind_the_chunk_to_its_key_and_the_secret() -> None:
    sealer = ChunkSealer(KEY)
    keys = chunk_keys(2)
    chunk = make_chunk(keys[0])
    blob = encode_blob(chunk, sealer)
    assert decode_blob(blob, keys[0], sealer) == chunk
    for wrong_sealer, key, reason in [
        (ChunkSealer(b"another-key-of-16-bytes"), keys[0], RejectReason.AUTH),
        (sealer, keys[1], RejectReason.AUTH),  # a valid blob moved under another key
        (None, keys[0], RejectReason.AUTH),  # a tagged blob and no key
    ]:
        with pytest.raises(ChunkRejected) as error:
            decode_blob(blob, key, wrong_sealer)
        assert error.value.reason is reason
    with pytest.raises(ChunkRejected) as untagged:  # planted without a tag
        decode_blob(encode_blob(chunk), keys[0], sealer)
    assert untagged.value.reason is RejectReason.AUTH
    # The in-process CPU tier checks only the crc.
    assert decode_blob(blob, keys[0], sealer, authenticate=False) == chunk


def test_with_a_key_a_chunk_planted_in_redis_is_not_served(redis_server: RedisServer, tmp_path: Path) -> None:
    registry = CollectorRegistry()
    keyed = key_file(tmp_path)
    chunks = [make_chunk(k) for k in chunk_keys(2)]
    # An attacker with Redis access writes well-formed KV, untagged and tagged with a guess.
    planter = open_store(CollectorRegistry(), redis_url=redis_server.url)
    planter.put(LAYOUT, chunks[:1])
    planter.close()
    guesser = open_store(
        CollectorRegistry(),
        redis_url=redis_server.url,
        kv_auth_key_file=key_file(tmp_path, b"guessed-key-1234567", "g"),
    )
    guesser.put(LAYOUT, chunks[1:])
    guesser.close()
    store = open_store(registry, redis_url=redis_server.url, kv_auth_key_file=keyed)
    try:
        assert store.get(chunks[0].key) is None
        assert store.get(chunks[1].key) is None
        assert dropped(registry, Tier.REMOTE, RejectReason.AUTH) == 2
        with redis_server.client() as client:
            for chunk in chunks:
                assert not client.exists(engine_key(chunk.key).to_string() + "kv_bytes")
        # What a store with the right key writes, another with the key reads back.
        store.put(LAYOUT, chunks)
    finally:
        store.close()
    reader = open_store(CollectorRegistry(), redis_url=redis_server.url, kv_auth_key_file=keyed)
    try:
        fetched = [reader.get(chunk.key) for chunk in chunks]
        assert [f.tier if f else None for f in fetched] == [Tier.REMOTE, Tier.REMOTE]
        assert [f.chunk if f else None for f in fetched] == chunks
    finally:
        reader.close()


def test_with_a_key_a_planted_disk_file_is_dropped(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    disk = {"disk_dir": tmp_path / "disk", "disk_bytes": 1 << 20}
    tokens = prompt(3, CHUNK_TOKENS)
    unkeyed = open_store(CollectorRegistry(), **disk)
    chunk = put_prompt(unkeyed, tokens)[0]
    unkeyed.close()
    store = open_store(registry, kv_auth_key_file=key_file(tmp_path), **disk)
    try:
        assert store.get(chunk.key) is None  # adopted from the directory, then refused
        assert dropped(registry, Tier.DISK, RejectReason.AUTH) == 1
        assert not list((tmp_path / "disk").glob("*" + DISK_SUFFIX))
    finally:
        store.close()


# --- the disk directory -------------------------------------------------------------------


def test_the_disk_directory_and_its_files_are_owner_only(make_store: StoreFactory, tmp_path: Path) -> None:
    directory = tmp_path / "disk"
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    store = make_store(disk_dir=directory, disk_bytes=1 << 20)
    put_prompt(store, prompt(4, 2 * CHUNK_TOKENS))
    store.close()  # waits for queued disk writes
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    files = list(directory.glob("*" + DISK_SUFFIX))
    assert len(files) == 2
    assert {stat.S_IMODE(f.stat().st_mode) for f in files} == {0o600}
