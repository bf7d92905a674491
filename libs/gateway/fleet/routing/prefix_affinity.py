"""Prefix affinity: send a prompt where its prefix was computed last, unless that worker is
busier than the reuse is worth.

Why this exists beside the kvstore: with a fleet-wide kvstore every prefill worker can load a
stored prefix, so the kvstore's Lookup scores all of them the same. What still differs is
vLLM's own prefix cache inside each engine, which costs nothing to hit (no transfer, no
copy). The gateway cannot ask engines what they cache, but it knows where it sent each
prompt: this policy remembers the chained hashes of prompts' 256-token blocks (an
approximation of SGLang's cache-aware router, bounded by LRU) and scores each candidate by
the tokens of this prompt it probably holds minus a load penalty.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

from cleave.common.v1 import common_pb2
from libs.gateway.fleet.pool import Endpoint
from libs.gateway.fleet.routing.policy import register

BLOCK_TOKENS = 256
# A request queued or running on a worker is worth about this many prompt tokens of reuse:
# SmolLM2 on CPU prefills ~400-1,000 tokens/s, a queued request waits about as long.
TOKENS_PER_QUEUED_REQUEST = 512
MAX_REMEMBERED_BLOCKS = 200_000


def block_hashes(
    token_ids: Sequence[int],
    block_tokens: int = BLOCK_TOKENS,
    salt: str = "",
    lora: common_pb2.LoraAdapter | None = None,
) -> list[bytes]:
    """Chained hashes of the prompt's full blocks: equal hashes mean equal prefixes under the
    same cache salt and LoRA adapter. They start the chain, as vLLM folds cache_salt and the
    adapter into a prompt's block hashes: an engine reuses no KV across salts or adapters, so
    neither does this estimate."""
    hashes = []
    previous = hashlib.blake2b(salt.encode(), digest_size=16, person=b"cache_salt").digest() if salt else b""
    if lora is not None:
        scope = b"\0".join((previous, lora.name.encode(), lora.path.encode()))
        previous = hashlib.blake2b(scope, digest_size=16, person=b"lora").digest()
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        block = ",".join(map(str, token_ids[start : start + block_tokens])).encode()
        previous = hashlib.blake2b(previous + block, digest_size=16).digest()
        hashes.append(previous)
    return hashes


@register
class PrefixAffinity:
    name = "prefix_affinity"

    def __init__(
        self,
        tokens_per_queued_request: int = TOKENS_PER_QUEUED_REQUEST,
        max_blocks: int = MAX_REMEMBERED_BLOCKS,
    ) -> None:
        self._penalty = tokens_per_queued_request
        self._max_blocks = max_blocks
        self._owner: OrderedDict[bytes, str] = OrderedDict()  # block hash -> worker address

    def pick(
        self,
        candidates: Sequence[Endpoint],
        prompt_token_ids: Sequence[int],
        cache_salt: str = "",
        lora: common_pb2.LoraAdapter | None = None,
    ) -> Endpoint:
        hashes = block_hashes(prompt_token_ids, salt=cache_salt, lora=lora)
        chosen = max(candidates, key=lambda e: (self._score(e, hashes), -load(e), e.address))
        self._remember(hashes, chosen.address)
        return chosen

    def cached_tokens(
        self,
        candidates: Sequence[Endpoint],
        prompt_token_ids: Sequence[int],
        cache_salt: str = "",
        lora: common_pb2.LoraAdapter | None = None,
    ) -> dict[str, int]:
        """Each candidate's prompt tokens this policy thinks it holds (read before `pick`
        records the prompt under its choice)."""
        hashes = block_hashes(prompt_token_ids, salt=cache_salt, lora=lora)
        return {e.address: self._remembered_tokens(e.address, hashes) for e in candidates}

    def _remembered_tokens(self, address: str, hashes: Sequence[bytes]) -> int:
        matched = 0
        for block in hashes:
            if self._owner.get(block) != address:
                break
            matched += 1
        return matched * BLOCK_TOKENS

    def _score(self, endpoint: Endpoint, hashes: Sequence[bytes]) -> float:
        return self._remembered_tokens(endpoint.address, hashes) - self._penalty * load(endpoint)

    def _remember(self, hashes: Sequence[bytes], address: str) -> None:
        for block in hashes:
            self._owner[block] = address
            self._owner.move_to_end(block)
        while len(self._owner) > self._max_blocks:
            self._owner.popitem(last=False)


def load(endpoint: Endpoint) -> int:
    """Requests queued or running on the worker: this gateway's in flight and its polled own."""
    return endpoint.admitted + endpoint.stats.num_waiting + endpoint.stats.num_running
