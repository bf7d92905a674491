"""A service's RPC outcome metrics, recorded the same way by every servicer (methods.py) and
by the code that counts requests inside a shared call (the worker's GenerateMany)."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from prometheus_client import Counter, Histogram

OK = "ok"


@dataclass(frozen=True)
class RpcMetrics:
    """`calls` counts calls by method and outcome ("ok", or the status code's name in lower
    case: "invalid_argument", "internal", ...); `seconds`, when given, times the calls that
    succeeded, by method. Each service names its own metrics (cleave_<service>_...)."""

    calls: Counter
    seconds: Histogram | None = None

    def succeeded(self, method: str, seconds: float | None = None) -> None:
        self.calls.labels(method, OK).inc()
        if self.seconds is not None and seconds is not None:
            self.seconds.labels(method).observe(seconds)

    def failed(self, method: str, status: grpc.StatusCode) -> None:
        self.calls.labels(method, status.name.lower()).inc()
