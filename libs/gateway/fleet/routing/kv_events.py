"""KV-event routing: send a prompt to the worker whose engine holds the longest part of it, as
that engine's own KV events say (not where this gateway sent it: prefix_affinity's guess),
unless that worker is busier than the reuse is worth.

Each worker's cached blocks come from its KV event stream (libs/gateway/fleet/kv_cache_watch.py,
on while this policy is chosen); the prompt is hashed as that worker's engine hashes blocks
(libs/kvevents/hashing.py: vLLM's function, seed and block size, the request's cache_salt), so
a block counts only where the engine would reuse it. Every gateway scores from the engines'
own word, so several gateways agree without talking to each other. The trade against load is
Dynamo's KV router's (overlap against load) in prefix_affinity's units: cached prompt tokens
minus TOKENS_PER_QUEUED_REQUEST per request queued or running there.
"""

from __future__ import annotations

from collections.abc import Sequence

from cleave.common.v1 import common_pb2
from libs.gateway.fleet.pool import Endpoint
from libs.gateway.fleet.routing.policy import register
from libs.gateway.fleet.routing.prefix_affinity import TOKENS_PER_QUEUED_REQUEST, load
from libs.kvevents.hashing import BlockHasher, LoraIdentity


@register
class KvEvents:
    name = "kv_events"  # the gateway's pool follows the workers' KV events for it (server.py)

    def __init__(self, tokens_per_queued_request: int = TOKENS_PER_QUEUED_REQUEST) -> None:
        self._penalty = tokens_per_queued_request

    def pick(
        self,
        candidates: Sequence[Endpoint],
        prompt_token_ids: Sequence[int],
        cache_salt: str = "",
        lora: common_pb2.LoraAdapter | None = None,
    ) -> Endpoint:
        cached = self.cached_tokens(candidates, prompt_token_ids, cache_salt, lora)
        return max(
            candidates,
            key=lambda e: (cached[e.address] - self._penalty * load(e), -load(e), e.address),
        )

    def cached_tokens(
        self,
        candidates: Sequence[Endpoint],
        prompt_token_ids: Sequence[int],
        cache_salt: str = "",
        lora: common_pb2.LoraAdapter | None = None,
    ) -> dict[str, int]:
        """Each candidate's prompt tokens its engine holds from the start (0 where unknown)."""
        keys_by_hasher: dict[BlockHasher, list[int]] = {}
        # vLLM hashes an adapter's blocks by its name and path (the id is the engine's own).
        identity = LoraIdentity(lora.name, lora.path, 0) if lora is not None else None
        cached = {}
        for endpoint in candidates:
            blocks, hasher = endpoint.cached_blocks, endpoint.kv_hasher
            if blocks is None or hasher is None:
                cached[endpoint.address] = 0
                continue
            if hasher not in keys_by_hasher:  # workers of one fleet share one: hashed once
                keys_by_hasher[hasher] = hasher.keys(prompt_token_ids, cache_salt=cache_salt, lora=identity)
            cached[endpoint.address] = blocks.prefix_blocks(keys_by_hasher[hasher]) * hasher.block_size
        return cached
