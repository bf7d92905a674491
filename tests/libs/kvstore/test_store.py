"""KvStore on its memory and disk tiers: round trips, lookups, bounds, LRU, restart, bad chunks."""

from __future__ import annotations

from pathlib import Path

from cleave.kvstore.v1 import kvstore_pb2
from libs.kvstore.metrics import Tier
from libs.kvstore.store import PutOutcome, StoreStats, TierStatus
from tests.libs.kvstore.helpers import (
    BLOB_ALLOCATION,
    CHUNK_TOKENS,
    LAYOUT,
    StoreFactory,
    make_chunk,
    prompt,
    put_prompt,
)


def tier(stats: StoreStats, which: Tier) -> TierStatus:
    return next(status for status in stats.tiers if status.tier is which)


def test_put_then_lookup_and_get_round_trip(make_store: StoreFactory) -> None:
    store = make_store()
    tokens = prompt(1, 2 * CHUNK_TOKENS + 7)
    assert store.lookup(tokens, LAYOUT).matched_tokens == 0
    chunks = put_prompt(store, tokens)
    result = store.lookup(tokens, LAYOUT)
    assert result.matched_tokens == len(tokens)
    assert [t for _, t in result.located] == [Tier.CPU] * 3
    for chunk in chunks:
        fetched = store.get(chunk.key)
        assert fetched is not None and fetched.tier is Tier.CPU
        assert fetched.chunk == chunk
    # A longer prompt with the same start matches the stored full chunks only: the stored
    # 7-token tail is keyed by those 7 tokens, the longer prompt's third chunk by 16.
    longer = tokens + prompt(2, 20)
    assert store.lookup(longer, LAYOUT).matched_tokens == 2 * CHUNK_TOKENS


def test_second_put_of_the_same_chunks_reports_exists(make_store: StoreFactory) -> None:
    store = make_store()
    chunks = [make_chunk(k) for k in store.chunk_keys(prompt(2, 40), LAYOUT)]
    assert store.put(LAYOUT, chunks) == [PutOutcome.STORED] * 3
    assert store.put(LAYOUT, chunks) == [PutOutcome.EXISTS] * 3


def test_corrupt_and_mismatched_chunks_are_rejected_not_stored(make_store: StoreFactory) -> None:
    store = make_store()
    good, corrupt = (make_chunk(k) for k in store.chunk_keys(prompt(3, 32), LAYOUT))
    corrupt.kv.data = bytes(len(corrupt.kv.data))  # crc no longer matches
    other_layout = type(LAYOUT)()
    other_layout.CopyFrom(LAYOUT)
    other_layout.model_fingerprint = "another-model"
    assert store.put(LAYOUT, [good, corrupt]) == [PutOutcome.STORED, PutOutcome.REJECTED]
    assert store.put(other_layout, [good]) == [PutOutcome.REJECTED]  # the key says LAYOUT
    assert store.get(corrupt.key) is None
    assert store.stats().chunks_rejected == 2
    # Under the other layout the same tokens have other keys, which hold nothing.
    assert store.lookup(prompt(3, 32), other_layout).matched_tokens == 0


def test_chunks_larger_than_a_quarter_of_memory_are_refused(make_store: StoreFactory) -> None:
    store = make_store(cpu_bytes=8 * 1024)  # 2 KiB max: a full 2 KiB chunk plus header is more
    chunk = make_chunk(store.chunk_keys(prompt(4, CHUNK_TOKENS), LAYOUT)[0])
    assert store.put(LAYOUT, [chunk]) == [PutOutcome.REJECTED]


def test_memory_and_disk_stay_within_bounds_under_distinct_prefixes(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    disk_dir = tmp_path / "disk"
    cpu_bytes, disk_bytes = 16 * BLOB_ALLOCATION, 40 * BLOB_ALLOCATION
    store = make_store(cpu_bytes=cpu_bytes, disk_dir=disk_dir, disk_bytes=disk_bytes)
    first = put_prompt(store, prompt(100, CHUNK_TOKENS))
    for seed in range(101, 181):  # 80 more one-chunk prompts: 5x memory, 2x disk
        put_prompt(store, prompt(seed, CHUNK_TOKENS))
        stats = store.stats()
        assert tier(stats, Tier.CPU).bytes_used <= cpu_bytes
        assert tier(stats, Tier.DISK).bytes_used <= disk_bytes
        assert sum(f.stat().st_size for f in disk_dir.iterdir()) <= disk_bytes
    stats = store.stats()
    assert tier(stats, Tier.CPU).counts.evictions >= 81 - 16
    assert tier(stats, Tier.DISK).counts.evictions >= 81 - 40
    assert tier(stats, Tier.DISK).num_chunks == len(list(disk_dir.iterdir()))
    assert store.get(first[0].key) is None  # the oldest went from both tiers
    last = put_prompt(store, prompt(181, CHUNK_TOKENS))[0]
    fetched = store.get(last.key)
    assert fetched is not None and fetched.tier is Tier.CPU


def test_reads_refresh_recency_so_hot_chunks_survive(make_store: StoreFactory) -> None:
    store = make_store(cpu_bytes=8 * BLOB_ALLOCATION)  # 8 chunks
    hot = put_prompt(store, prompt(200, CHUNK_TOKENS))[0]
    for seed in range(201, 221):
        put_prompt(store, prompt(seed, CHUNK_TOKENS))
        assert store.get(hot.key) is not None  # touched after every put: never the LRU one
    cold = store.chunk_keys(prompt(201, CHUNK_TOKENS), LAYOUT)[0]
    assert store.get(cold) is None


def test_disk_hits_are_promoted_to_memory(make_store: StoreFactory, tmp_path: Path) -> None:
    store = make_store(cpu_bytes=4 * BLOB_ALLOCATION, disk_dir=tmp_path / "disk", disk_bytes=1 << 20)
    first = put_prompt(store, prompt(300, CHUNK_TOKENS))[0]
    for seed in range(301, 309):  # push `first` out of memory
        put_prompt(store, prompt(seed, CHUNK_TOKENS))
    assert store.lookup(prompt(300, CHUNK_TOKENS), LAYOUT).located[0][1] is Tier.DISK
    fetched = store.get(first.key)
    assert fetched is not None and fetched.tier is Tier.DISK and fetched.chunk == first
    again = store.get(first.key)
    assert again is not None and again.tier is Tier.CPU


def test_a_restarted_store_serves_what_its_disk_directory_holds(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    disk = {"disk_dir": tmp_path / "disk", "disk_bytes": 1 << 20}
    before = make_store(**disk)
    tokens = prompt(400, 3 * CHUNK_TOKENS)
    chunks = put_prompt(before, tokens)
    before.close()
    after = make_store(**disk)
    assert after.lookup(tokens, LAYOUT).matched_tokens == len(tokens)
    fetched = [after.get(chunk.key) for chunk in chunks]
    assert [f.tier if f else None for f in fetched] == [Tier.DISK] * 3
    assert [f.chunk if f else None for f in fetched] == chunks


def test_a_restart_keeps_only_what_fits_a_smaller_disk_bound(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    disk_dir = tmp_path / "disk"
    before = make_store(disk_dir=disk_dir, disk_bytes=1 << 20)
    for seed in range(500, 510):
        put_prompt(before, prompt(seed, CHUNK_TOKENS))
    before.close()
    after = make_store(disk_dir=disk_dir, disk_bytes=4 * BLOB_ALLOCATION)
    assert len(list(disk_dir.iterdir())) == 4
    assert tier(after.stats(), Tier.DISK).bytes_used <= 4 * BLOB_ALLOCATION


def test_a_corrupt_disk_file_is_rejected_dropped_and_not_served(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    disk_dir = tmp_path / "disk"
    before = make_store(disk_dir=disk_dir, disk_bytes=1 << 20)
    chunk = put_prompt(before, prompt(600, CHUNK_TOKENS))[0]
    before.close()
    (path,) = disk_dir.iterdir()
    damaged = bytearray(path.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF  # bit rot in the KV data
    path.write_bytes(bytes(damaged))
    after = make_store(disk_dir=disk_dir, disk_bytes=1 << 20)
    assert after.get(chunk.key) is None
    assert after.stats().chunks_rejected == 1
    assert not path.exists()
    assert after.lookup(prompt(600, CHUNK_TOKENS), LAYOUT).matched_tokens == 0


def test_get_of_a_never_stored_key_misses_every_tier(make_store: StoreFactory, tmp_path: Path) -> None:
    store = make_store(disk_dir=tmp_path / "disk", disk_bytes=1 << 20)
    key: kvstore_pb2.ChunkKey = store.chunk_keys(prompt(700, 4), LAYOUT)[0]
    assert store.get(key) is None
    stats = store.stats()
    assert (tier(stats, Tier.CPU).counts.misses, tier(stats, Tier.DISK).counts.misses) == (1, 1)


def test_salted_prefixes_are_stored_and_found_only_under_their_salt(make_store: StoreFactory) -> None:
    store = make_store()
    tokens = prompt(800, 2 * CHUNK_TOKENS)
    chunks = [make_chunk(key) for key in store.chunk_keys(tokens, LAYOUT, "tenant-a")]
    store.put(LAYOUT, chunks)
    assert store.lookup(tokens, LAYOUT, "tenant-a").matched_tokens == 2 * CHUNK_TOKENS
    assert store.lookup(tokens, LAYOUT, "tenant-b").matched_tokens == 0
    assert store.lookup(tokens, LAYOUT).matched_tokens == 0
