"""Where a request's prompt is computed: one pure function of the request's facts.

The four routes, in the order the rules are tried:
- COLOCATED: the request was admitted to a colocated (`both`) worker, which computes the
  prompt and decodes; there is no handoff.
- REMOTE_PREFILL (for prompts with images, always): a prefill worker computes the prompt and
  hands its KV to the decode worker. Images go there because the prefill worker has them, and
  the kvstore keys KV by token ids alone (every image's placeholders are the same ids).
- STORED_PREFIX: the kvstore holds all but a short tail of the prompt; the decode worker loads
  the stored prefix itself and computes the tail.
- LOCAL_PREFILL: conditional disaggregation (disaggregation.py) decided the decode worker
  computes the prompt itself.
- otherwise REMOTE_PREFILL.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from libs.gateway.serving.disaggregation import Decision, DisaggConfig, DisaggInputs, decide


class Route(enum.Enum):
    COLOCATED = "colocated"
    REMOTE_PREFILL = "remote_prefill"
    STORED_PREFIX = "stored_prefix"
    LOCAL_PREFILL = "local_prefill"

    @property
    def prefills_remotely(self) -> bool:
        return self is Route.REMOTE_PREFILL


@dataclass(frozen=True)
class RouteFacts:
    colocated: bool  # admitted to a `both` worker
    has_images: bool
    prompt_tokens: int
    stored_tokens: int  # leading prompt tokens the kvstore holds (0: not asked, or none)
    # The decode worker computes at most this many uncached tokens after a stored prefix.
    stored_prefix_max_tail: int
    # Conditional disaggregation's inputs; None when every prompt is prefilled remotely.
    placement: DisaggInputs | None = None


@dataclass(frozen=True)
class RouteChoice:
    route: Route
    # The conditional policy's decision, when the choice consulted it (to count and log).
    placement: Decision | None = None


def needs_stored_prefix(colocated: bool, has_images: bool) -> bool:
    """Whether the kvstore is worth asking: only its answer can change the route then."""
    return not colocated and not has_images


def choose_route(facts: RouteFacts, disagg: DisaggConfig) -> RouteChoice:
    if facts.colocated:
        return RouteChoice(Route.COLOCATED)
    if facts.has_images:
        return RouteChoice(Route.REMOTE_PREFILL)
    tail = facts.prompt_tokens - facts.stored_tokens
    if facts.stored_tokens > 0 and tail <= facts.stored_prefix_max_tail:
        return RouteChoice(Route.STORED_PREFIX)
    if disagg.conditional and facts.placement is not None:
        decision = decide(disagg, facts.placement)
        return RouteChoice(Route.REMOTE_PREFILL if decision.remote else Route.LOCAL_PREFILL, decision)
    return RouteChoice(Route.REMOTE_PREFILL)
