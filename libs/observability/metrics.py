"""Prometheus helpers: latency buckets that resolve LLM serving's time scales.

Default prometheus buckets (5 ms .. 10 s, coarse) cannot tell a 30 ms inter-token
latency from a 60 ms one; these can.
"""

from __future__ import annotations

import prometheus_client

# Time to first token: tens of ms (cached, short prompt) to tens of s (long prompt, queued).
TTFT_BUCKETS_S = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
# Inter-token latency / time per output token: ms to a second.
ITL_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.5,
)
# End-to-end request latency.
E2E_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
# Internal RPCs on loopback or a fast network.
RPC_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
# Sizes in tokens (prompt / output lengths).
TOKEN_COUNT_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def start_metrics_server(port: int, host: str = "127.0.0.1") -> int:
    """Serves /metrics for this process's default registry; returns the bound port."""
    server, _thread = prometheus_client.start_http_server(port, addr=host)
    return int(server.server_port)
