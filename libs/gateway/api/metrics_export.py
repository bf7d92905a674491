"""What /metrics answers: this process's metrics, or, when the gateway runs several API
processes (--api-server-count, libs/gateway/api_servers.py), all of theirs from the folder they
share (prometheus_client's multiprocess mode: counters and histograms summed, gauges by each
metric's multiprocess_mode) plus this process's view of the workers, which every process polls
alike."""

from __future__ import annotations

import os
from collections.abc import Sequence

import prometheus_client
from prometheus_client import CollectorRegistry, multiprocess
from prometheus_client.registry import Collector

# Where the API processes' metrics live; set in their environment before they start (the
# library reads it when a metric is created).
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


def latest(collectors: Sequence[Collector]) -> bytes:
    """The exposition text. `collectors`: this process's own (not kept in the shared folder)."""
    folder = os.environ.get(METRICS_DIR_ENV)
    if not folder:
        return prometheus_client.generate_latest()
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=folder)
    for collector in collectors:
        registry.register(collector)
    return prometheus_client.generate_latest(registry)
