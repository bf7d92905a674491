"""Requests' block tables on the block pool: prefix hits, slot allocation, caching, freeing
(vLLM's KVCacheManager for one full-attention KV cache group).

The rules kept from vLLM (vllm/v1/core/kv_cache_manager.py):
- A hit covers whole cached blocks only, and never the last token of the request: its
  logits must be computed, so a fully cached prompt recomputes its last block.
- allocate_slots gives a request the blocks its computed tokens plus this step's new ones
  need, or nothing at all when the free blocks (less the cached free ones a hit is about to
  take) do not suffice: the scheduler then preempts.
- Blocks are cached (made findable by hash) as soon as they are allocated for tokens that
  will be computed in this step, so a second sequence admitted in the same step hits the
  first one's prompt blocks.
"""

from __future__ import annotations

from libs.kvevents.hashing import BlockHasher
from libs.mockengine.blocks import BlockPool, KvBlock
from libs.mockengine.request import SimRequest


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KvCacheManager:
    def __init__(self, pool: BlockPool, hasher: BlockHasher, *, max_model_len: int) -> None:
        self.pool = pool
        self.hasher = hasher
        self.block_size = hasher.block_size
        self.max_model_len = max_model_len

    def update_hashes(self, request: SimRequest) -> None:
        """Hashes the request's newly completed full blocks (prompt and output tokens)."""
        self.hasher.extend(
            request.block_hashes, request.all_token_ids, cache_salt=request.cache_salt, lora=request.lora
        )

    def computed_blocks(self, request: SimRequest) -> list[KvBlock]:
        """The cached blocks of the longest hit of a request about to be admitted."""
        if request.skips_prefix_cache:
            return []
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        return self.pool.longest_hit(request.block_hashes, max_hit_blocks)

    def allocate_slots(
        self,
        request: SimRequest,
        num_new_tokens: int,
        *,
        new_computed_blocks: list[KvBlock] | None = None,
        num_external_tokens: int = 0,
        delay_caching: bool = False,
    ) -> bool:
        """Blocks for `num_new_tokens` more tokens (after any hit and external tokens);
        False, with nothing changed, when the pool cannot supply them."""
        hit = new_computed_blocks or []
        num_computed = request.num_computed_tokens + len(hit) * self.block_size + num_external_tokens
        num_slots = min(num_computed + num_new_tokens, self.max_model_len)
        needed = _cdiv(num_slots, self.block_size) - len(request.blocks) - len(hit)
        taken_from_free = sum(1 for block in hit if block.ref_cnt == 0)
        if needed > self.pool.num_free_blocks - taken_from_free:
            return False
        if hit:
            self.pool.touch(hit)
            request.blocks.extend(hit)
            request.num_cached_blocks = len(request.blocks)
        if needed > 0:
            request.blocks.extend(self.pool.allocate(needed))
        if not delay_caching:
            self.cache_blocks(request, min(num_computed + num_new_tokens, request.num_tokens))
        return True

    def cache_blocks(self, request: SimRequest, num_tokens: int) -> None:
        """Makes the request's full blocks among its first `num_tokens` tokens findable."""
        num_full = min(num_tokens // self.block_size, len(request.block_hashes), len(request.blocks))
        if num_full <= request.num_cached_blocks:
            return
        extra_keys = [
            self.hasher.extra_keys(index * self.block_size, request.cache_salt, request.lora)
            for index in range(num_full)
        ]
        self.pool.cache_full_blocks(
            request.blocks,
            request.block_hashes,
            num_cached=request.num_cached_blocks,
            num_full=num_full,
            token_ids=request.all_token_ids,
            block_size=self.block_size,
            extra_keys=extra_keys,
            lora=request.lora,
        )
        request.num_cached_blocks = num_full

    def free(self, request: SimRequest) -> None:
        """Gives the request's blocks back, tail first (so its last blocks are evicted first)."""
        self.pool.free(reversed(request.blocks))
        request.blocks = []
        request.num_cached_blocks = 0

    def blocks_for(self, num_tokens: int) -> int:
        return _cdiv(num_tokens, self.block_size)
