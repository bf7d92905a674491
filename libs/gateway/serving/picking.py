"""A routing policy's choice for one request, in the shape admission control asks for it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from libs.gateway.common.generation import GenerationSpec
from libs.gateway.fleet.pool import Endpoint
from libs.gateway.fleet.routing import RoutingPolicy
from libs.gateway.serving.disaggregation import PrefixEstimate


def picker(
    policy: RoutingPolicy, spec: GenerationSpec, estimate: PrefixEstimate | None = None
) -> Callable[[Sequence[Endpoint]], Endpoint]:
    """The policy's choice among the workers admission control offers; `estimate` reads the
    policy's cached-prefix guesses first (the pick records this prompt)."""

    def pick(candidates: Sequence[Endpoint]) -> Endpoint:
        if estimate is not None:
            estimate.observe(candidates, spec.prompt_token_ids, spec.cache_salt, spec.lora)
        return policy.pick(candidates, spec.prompt_token_ids, spec.cache_salt, spec.lora)

    return pick
