"""Round robin: each request goes to the next healthy worker in turn."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from cleave.common.v1 import common_pb2
from libs.gateway.fleet.pool import Endpoint
from libs.gateway.fleet.routing.policy import register


@register
class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._counter = itertools.count()

    def pick(
        self,
        candidates: Sequence[Endpoint],
        prompt_token_ids: Sequence[int],
        cache_salt: str = "",
        lora: common_pb2.LoraAdapter | None = None,
    ) -> Endpoint:
        ordered = sorted(candidates, key=lambda e: e.address)
        return ordered[next(self._counter) % len(ordered)]
