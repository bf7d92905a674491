"""Least load: fewest requests in flight on the worker, this gateway's (`admitted`) and the other
gateways' as the worker last reported them (`elsewhere`, with every GenerateMany message), then
the worker's own queue and KV usage from its last polled stats (in-flight counts are fresher
than polls)."""

from __future__ import annotations

from collections.abc import Sequence

from cleave.common.v1 import common_pb2
from libs.gateway.fleet.pool import Endpoint
from libs.gateway.fleet.routing.policy import register


@register
class LeastLoad:
    name = "least_load"

    def pick(
        self,
        candidates: Sequence[Endpoint],
        prompt_token_ids: Sequence[int],
        cache_salt: str = "",
        lora: common_pb2.LoraAdapter | None = None,
    ) -> Endpoint:
        return min(
            candidates,
            key=lambda e: (
                e.admitted + e.elsewhere,
                e.stats.num_waiting,
                e.stats.num_running,
                e.stats.kv_cache_usage,
                e.address,
            ),
        )
