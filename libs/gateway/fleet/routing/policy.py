"""The routing protocol and its registry."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from cleave.common.v1 import common_pb2
from libs.gateway.fleet.pool import Endpoint


class RoutingPolicy(Protocol):
    name: str

    def pick(
        self,
        candidates: Sequence[Endpoint],
        prompt_token_ids: Sequence[int],
        cache_salt: str = "",
        lora: common_pb2.LoraAdapter | None = None,
    ) -> Endpoint:
        """Chooses one of `candidates` (never empty, all healthy). `cache_salt` and `lora`: the
        request's (engines reuse KV only between requests with the same salt and adapter)."""
        ...


@runtime_checkable
class PrefixCacheEstimate(Protocol):
    """A policy that knows which prompt tokens each worker caches (conditional disaggregation
    reads it: libs/gateway/serving/disaggregation.py)."""

    def cached_tokens(
        self,
        candidates: Sequence[Endpoint],
        prompt_token_ids: Sequence[int],
        cache_salt: str = "",
        lora: common_pb2.LoraAdapter | None = None,
    ) -> dict[str, int]: ...


POLICIES: dict[str, Callable[[], RoutingPolicy]] = {}


def register(factory: Callable[[], RoutingPolicy]) -> Callable[[], RoutingPolicy]:
    POLICIES[factory().name] = factory
    return factory


def create_policy(name: str) -> RoutingPolicy:
    if name not in POLICIES:
        raise ValueError(f"unknown routing policy {name!r}; known: {', '.join(sorted(POLICIES))}")
    return POLICIES[name]()
