"""Prometheus metrics of the local stack (served on the gateway's /metrics)."""

from __future__ import annotations

from prometheus_client import Counter

RESTARTS = Counter(
    "cleave_stack_restarts_total", "Local-stack children restarted after they crashed", ["service"]
)
GAVE_UP = Counter(
    "cleave_stack_restarts_given_up_total",
    "Local-stack children left down: they crashed more often than the restart budget allows",
    ["service"],
)
