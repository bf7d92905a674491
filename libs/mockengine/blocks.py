"""A fixed pool of KV blocks with prefix caching, as vLLM v1's BlockPool keeps it.

What is simulated (vllm/v1/core/block_pool.py, kv_cache_utils.FreeKVCacheBlockQueue):
- Block 0 is the null block, never handed out; usage is 1 - free / (num_blocks - 1).
- Free blocks wait in one queue whose front is reused first. Freeing a request's blocks
  (passed tail first, so a prompt's last blocks go before its first) puts blocks that hold
  no cached content at the front (reused at once) and cached ones at the back: a freed
  cached block stays findable by its hash until the queue reaches it, so the least recently
  freed cached block is evicted first (LRU).
- A cache hit on a free block takes it out of the queue (touch); ref counts let requests
  share blocks (n > 1 sequences, equal prefixes).
- Handing out a cached block evicts its hash: a BlockRemoved event. Caching full blocks
  emits one BlockStored event per call; a reset emits AllBlocksCleared. Events are
  collected until the step that caused them takes them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from libs.kvevents.hashing import LoraIdentity, event_extra_keys
from libs.mockengine.kv_events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KvEvent


@dataclass(slots=True, eq=False)
class KvBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None


class FreeBlockQueue:
    """Free blocks in reuse order: the front is handed out (and its hash evicted) first."""

    def __init__(self, blocks: Iterable[KvBlock]) -> None:
        self._order: OrderedDict[int, KvBlock] = OrderedDict((block.block_id, block) for block in blocks)

    def __len__(self) -> int:
        return len(self._order)

    def popleft(self) -> KvBlock:
        return self._order.popitem(last=False)[1]

    def append(self, block: KvBlock) -> None:
        self._order[block.block_id] = block

    def prepend(self, block: KvBlock) -> None:
        self._order[block.block_id] = block
        self._order.move_to_end(block.block_id, last=False)

    def remove(self, block: KvBlock) -> None:
        del self._order[block.block_id]

    def block_ids(self) -> list[int]:
        """In reuse order (tests read the eviction order from it)."""
        return list(self._order)


class BlockPool:
    def __init__(self, num_blocks: int, *, enable_caching: bool = True, medium: str = MEDIUM_GPU) -> None:
        if num_blocks < 2:
            raise ValueError(f"a KV cache needs at least 2 blocks (one is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.medium = medium
        self.blocks = [KvBlock(block_id) for block_id in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.null_block = self.free_queue.popleft()
        # hash -> the blocks holding that content (two requests may compute the same block).
        self._cached: dict[bytes, dict[int, KvBlock]] = {}
        self._events: list[KvEvent] = []

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / (self.num_blocks - 1)

    @property
    def num_cached_blocks(self) -> int:
        return sum(len(blocks) for blocks in self._cached.values())

    def cached_block(self, block_hash: bytes) -> KvBlock | None:
        holders = self._cached.get(block_hash)
        return next(iter(holders.values())) if holders else None

    def longest_hit(self, block_hashes: Sequence[bytes], max_blocks: int) -> list[KvBlock]:
        """The cached blocks of the longest prefix of `block_hashes` (at most max_blocks)."""
        hit: list[KvBlock] = []
        if not self.enable_caching:
            return hit
        for block_hash in block_hashes[:max_blocks]:
            block = self.cached_block(block_hash)
            if block is None:
                break
            hit.append(block)
        return hit

    def allocate(self, count: int) -> list[KvBlock]:
        if count > self.num_free_blocks:
            raise ValueError(f"cannot allocate {count} blocks, {self.num_free_blocks} free")
        allocated = [self.free_queue.popleft() for _ in range(count)]
        for block in allocated:
            self._evict(block)
            block.ref_cnt = 1
        return allocated

    def touch(self, blocks: Iterable[KvBlock]) -> None:
        """Another holder for each block (a cache hit): a free one leaves the free queue."""
        for block in blocks:
            if block.ref_cnt == 0 and block is not self.null_block:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free(self, ordered_blocks: Iterable[KvBlock]) -> None:
        """Drops one holder of each block; `ordered_blocks` first-to-evict first."""
        evict_first: list[KvBlock] = []
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0 and block is not self.null_block:
                if block.block_hash is None or not self.enable_caching:
                    evict_first.append(block)
                else:
                    self.free_queue.append(block)
        for block in reversed(evict_first):
            self.free_queue.prepend(block)

    def cache_full_blocks(
        self,
        blocks: Sequence[KvBlock],
        block_hashes: Sequence[bytes],
        *,
        num_cached: int,
        num_full: int,
        token_ids: Sequence[int],
        block_size: int,
        extra_keys: Sequence[tuple[Any, ...] | None],
        lora: LoraIdentity | None,
    ) -> None:
        """Makes blocks [num_cached, num_full) of a request findable by their hashes.
        `extra_keys` holds the hash extra keys of every block of the request."""
        if not self.enable_caching or num_cached >= num_full:
            return
        for index in range(num_cached, num_full):
            block = blocks[index]
            block.block_hash = block_hashes[index]
            self._cached.setdefault(block.block_hash, {})[block.block_id] = block
        self._events.append(
            BlockStored(
                block_hashes=list(block_hashes[num_cached:num_full]),
                parent_block_hash=block_hashes[num_cached - 1] if num_cached else None,
                token_ids=list(token_ids[num_cached * block_size : num_full * block_size]),
                block_size=block_size,
                lora_id=lora.int_id if lora else None,
                medium=self.medium,
                lora_name=lora.name if lora else None,
                extra_keys=[event_extra_keys(keys) for keys in extra_keys[num_cached:num_full]],
            )
        )

    def reset_prefix_cache(self) -> bool:
        """Forgets every cached hash; refused (False) while any block is held, as vLLM."""
        if self.num_free_blocks != self.num_blocks - 1:
            return False
        self._cached.clear()
        for block in self.blocks:
            block.block_hash = None
        self._events.append(AllBlocksCleared())
        return True

    def take_events(self) -> list[KvEvent]:
        events, self._events = self._events, []
        return events

    def _evict(self, block: KvBlock) -> None:
        if block.block_hash is None:
            return
        holders = self._cached.get(block.block_hash)
        if holders is not None:
            holders.pop(block.block_id, None)
            if not holders:
                del self._cached[block.block_hash]
        self._events.append(BlockRemoved(block_hashes=[block.block_hash], medium=self.medium))
        block.block_hash = None
