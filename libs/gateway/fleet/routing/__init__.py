"""Routing policies: small plugins with one protocol, registered by name.

A policy picks one endpoint among the healthy candidates for a request. Add one by writing
a class with `name` and `pick()` and decorating it with `@register`.
"""

from libs.gateway.fleet.routing import kv_events, least_load, prefix_affinity, round_robin  # noqa: F401  (registers them)
from libs.gateway.fleet.routing.policy import (
    POLICIES,
    PrefixCacheEstimate,
    RoutingPolicy,
    create_policy,
    register,
)

__all__ = ["POLICIES", "PrefixCacheEstimate", "RoutingPolicy", "create_policy", "register"]
