"""Which blocks one engine's prefix cache holds, kept from its KV events.

The worker keeps one (what it tells a gateway that starts watching: kv_cache_feed.py) and each
gateway keeps one per worker it routes to (libs/gateway/fleet/kv_cache_watch.py). Blocks are
named by `block_key` (hashing.py). Only the engine's own cache counts: vLLM also publishes the
blocks its CPU offloading tier stores (medium "CPU"), which a request does not hit for free.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from libs.kvevents.hashing import block_key

# vLLM's MEDIUM_GPU: the engine's own KV cache, whatever the device (vLLM's CPU platform too).
ENGINE_CACHE_MEDIUMS = frozenset({None, "GPU"})


@dataclass(frozen=True)
class KvCacheUpdate:
    """One change, applied in this order: everything dropped (`cleared`), then `removed`,
    then `stored`. A snapshot is `cleared` with every cached block stored."""

    stored: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()
    cleared: bool = False


def updates_from_events(events: Iterable[Any]) -> list[KvCacheUpdate]:
    """vLLM's KV cache events (BlockStored, BlockRemoved, AllBlocksCleared), or the mock
    engine's, which carry vLLM's class names and fields, as updates in their order. Events
    about another medium than the engine's own cache are left out."""
    updates = []
    for event in events:
        kind = type(event).__name__
        if kind == "AllBlocksCleared":
            updates.append(KvCacheUpdate(cleared=True))
        elif getattr(event, "medium", None) not in ENGINE_CACHE_MEDIUMS:
            continue
        elif kind == "BlockStored":
            updates.append(KvCacheUpdate(stored=tuple(block_key(h) for h in event.block_hashes)))
        elif kind == "BlockRemoved":
            updates.append(KvCacheUpdate(removed=tuple(block_key(h) for h in event.block_hashes)))
    return updates


class CachedBlocks:
    def __init__(self) -> None:
        self._keys: set[int] = set()

    def apply(self, update: KvCacheUpdate) -> None:
        if update.cleared:
            self._keys.clear()
        self._keys.difference_update(update.removed)
        self._keys.update(update.stored)

    def clear(self) -> None:
        self._keys.clear()

    def snapshot(self) -> KvCacheUpdate:
        return KvCacheUpdate(stored=tuple(self._keys), cleared=True)

    def prefix_blocks(self, keys: Sequence[int]) -> int:
        """How many of `keys` (a prompt's blocks, first first) are cached from the start: a
        block is only reused after its parent, as vLLM's find_longest_cache_hit reads them."""
        for count, key in enumerate(keys):
            if key not in self._keys:
                return count
        return len(keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: int) -> bool:
        return key in self._keys
