"""Leases pin chunks against eviction until Release or their TTL."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.kvstore.identity import InvalidKey
from libs.kvstore.metrics import Tier
from tests.libs.kvstore.helpers import (
    BLOB_ALLOCATION,
    CHUNK_TOKENS,
    LAYOUT,
    FakeClock,
    StoreFactory,
    prompt,
    put_prompt,
)

CPU_CHUNKS = 8


def flood(store, first_seed: int, count: int) -> None:  # type: ignore[no-untyped-def]
    for seed in range(first_seed, first_seed + count):
        put_prompt(store, prompt(seed, CHUNK_TOKENS))


def test_a_leased_chunk_survives_a_flood_that_evicts_everything_else(
    make_store: StoreFactory, clock: FakeClock
) -> None:
    store = make_store(cpu_bytes=CPU_CHUNKS * BLOB_ALLOCATION, clock=clock)
    leased = put_prompt(store, prompt(1, CHUNK_TOKENS))[0]
    unleased = put_prompt(store, prompt(2, CHUNK_TOKENS))[0]
    grant = store.lease([leased.key], ttl_s=30)
    assert grant.num_pinned == 1
    flood(store, 100, 3 * CPU_CHUNKS)
    assert store.get(unleased.key) is None
    fetched = store.get(leased.key)
    assert fetched is not None and fetched.tier is Tier.CPU

    assert store.release(grant.lease_id)
    assert not store.release(grant.lease_id)  # only once
    flood(store, 200, 3 * CPU_CHUNKS)
    assert store.get(leased.key) is None  # evictable again


def test_an_expired_lease_unpins(make_store: StoreFactory, clock: FakeClock) -> None:
    store = make_store(cpu_bytes=CPU_CHUNKS * BLOB_ALLOCATION, clock=clock)
    leased = put_prompt(store, prompt(3, CHUNK_TOKENS))[0]
    store.lease([leased.key], ttl_s=5)
    clock.advance(4)
    flood(store, 300, 3 * CPU_CHUNKS)
    assert store.get(leased.key) is not None
    clock.advance(2)
    assert store.expire_leases() == 1
    assert store.stats().num_leases == 0
    flood(store, 400, 3 * CPU_CHUNKS)
    assert store.get(leased.key) is None


def test_ttls_default_and_are_capped(make_store: StoreFactory, clock: FakeClock) -> None:
    store = make_store(clock=clock, default_lease_s=10, max_lease_s=60)
    key = put_prompt(store, prompt(4, CHUNK_TOKENS))[0].key
    store.lease([key])  # default TTL
    store.lease([key], ttl_s=3600)  # cut to 60 s
    clock.advance(11)
    assert store.expire_leases() == 1
    clock.advance(50)
    assert store.expire_leases() == 1


def test_leases_pin_at_most_half_of_memory(make_store: StoreFactory, clock: FakeClock) -> None:
    store = make_store(cpu_bytes=CPU_CHUNKS * BLOB_ALLOCATION, clock=clock)
    keys = [put_prompt(store, prompt(seed, CHUNK_TOKENS))[0].key for seed in range(500, 500 + CPU_CHUNKS)]
    grant = store.lease(keys, ttl_s=30)
    assert grant.num_pinned == CPU_CHUNKS // 2
    # The unpinned half keeps new chunks storable.
    flood(store, 600, 2 * CPU_CHUNKS)
    assert sum(store.get(key) is not None for key in keys) == CPU_CHUNKS // 2


def test_disk_copies_are_pinned_too(make_store: StoreFactory, clock: FakeClock, tmp_path: Path) -> None:
    store = make_store(
        cpu_bytes=CPU_CHUNKS * BLOB_ALLOCATION,
        disk_dir=tmp_path / "d",
        disk_bytes=4 * BLOB_ALLOCATION,
        clock=clock,
    )
    leased = put_prompt(store, prompt(7, CHUNK_TOKENS))[0]
    grant = store.lease([leased.key], ttl_s=30)
    assert grant.num_pinned == 1
    flood(store, 700, 3 * CPU_CHUNKS)
    assert store.lookup(prompt(7, CHUNK_TOKENS), LAYOUT).matched_tokens == CHUNK_TOKENS
    disk_names = [p.name for p in (tmp_path / "d").iterdir()]
    assert any(leased.key.prefix_hash.lstrip("0") in name for name in disk_names)


def test_lease_of_unknown_keys_pins_nothing_and_malformed_keys_are_refused(make_store: StoreFactory) -> None:
    store = make_store()
    missing = store.chunk_keys(prompt(8, 4), LAYOUT)[0]
    assert store.lease([missing], ttl_s=1).num_pinned == 0
    bad = type(missing)()
    bad.CopyFrom(missing)
    bad.prefix_hash = "not-hex"
    with pytest.raises(InvalidKey):
        store.lease([bad], ttl_s=1)
