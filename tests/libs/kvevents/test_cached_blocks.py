"""A worker's cached blocks from KV events, as vLLM's and the mock's events describe them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from libs.kvevents.cached_blocks import CachedBlocks, KvCacheUpdate, updates_from_events
from libs.kvevents.hashing import BlockHasher, block_key


# Stand-ins with vLLM's class names and fields (the mock's events are the same shape).
@dataclass
class BlockStored:
    block_hashes: Sequence[bytes | int]
    medium: str | None = "GPU"


@dataclass
class BlockRemoved:
    block_hashes: Sequence[bytes | int]
    medium: str | None = "GPU"


class AllBlocksCleared:
    pass


def test_byte_and_integer_hashes_name_the_same_block() -> None:
    digest = bytes(range(32))
    assert block_key(digest) == int.from_bytes(digest[-8:], "big")
    assert block_key(int.from_bytes(digest, "big")) == block_key(digest)


def test_events_become_updates_in_order_and_other_mediums_are_left_out() -> None:
    events = [
        BlockStored([1, 2]),
        BlockStored([9], medium="CPU"),  # vLLM's offloading tier: not a free hit
        BlockRemoved([1]),
        AllBlocksCleared(),
        BlockStored([b"\x00" * 31 + b"\x07"], medium=None),
    ]
    assert updates_from_events(events) == [
        KvCacheUpdate(stored=(1, 2)),
        KvCacheUpdate(removed=(1,)),
        KvCacheUpdate(cleared=True),
        KvCacheUpdate(stored=(7,)),
    ]


def test_a_prompt_hits_only_the_blocks_cached_from_its_start() -> None:
    hasher = BlockHasher(4)
    prompt = list(range(16))  # 4 blocks
    keys = hasher.keys(prompt)
    blocks = CachedBlocks()
    for update in updates_from_events([BlockStored(hasher.hashes(prompt[:8]))]):
        blocks.apply(update)
    assert blocks.prefix_blocks(keys) == 2
    blocks.apply(KvCacheUpdate(removed=(keys[0],), stored=(keys[2], keys[3])))
    assert blocks.prefix_blocks(keys) == 0  # the first block is gone: nothing after it is reused
    assert blocks.prefix_blocks(hasher.keys(prompt, cache_salt="tenant")) == 0


def test_a_snapshot_rebuilds_the_same_set_elsewhere() -> None:
    source = CachedBlocks()
    source.apply(KvCacheUpdate(stored=(1, 2, 3)))
    source.apply(KvCacheUpdate(removed=(2,)))
    copy = CachedBlocks()
    copy.apply(KvCacheUpdate(stored=(40, 41)))  # stale: what it held before it (re)connected
    copy.apply(source.snapshot())
    assert (len(copy), 1 in copy, 3 in copy, 2 in copy, 40 in copy) == (2, True, True, False, False)
