"""`--api-server-count 2` on a mock-engine stack: both processes serve the one port (requests on
fresh connections all answered), and /metrics, whichever process answers, counts every
request of both (prometheus_client's multiprocess mode); SIGTERM stops them and the stack."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.multiprocess import MultiProcessCollector

from tests.e2e.harness import Service
from tests.e2e.stack import start_mock_stack, stop_gateway_stack

REQUESTS = 24


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, str]]:
    service, base_url = start_mock_stack("pd", tmp_path_factory.mktemp("cache"), "--api-server-count", "2")
    try:
        yield service, base_url
    finally:
        stop_gateway_stack(service)


def completion(base_url: str, model: str, i: int) -> str:
    # A new connection per request: the kernel spreads them over both processes.
    with httpx.Client(timeout=120) as client:
        response = client.post(
            f"{base_url}/v1/completions",
            json={"model": model, "prompt": f"request {i}", "max_tokens": 4, "ignore_eos": True},
        )
    response.raise_for_status()
    return str(response.json()["choices"][0]["finish_reason"])


def successes(text: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total{")
    )


def test_both_processes_serve_and_metrics_count_every_request(stack: tuple[Service, str]) -> None:
    service, base_url = stack
    gateways = [
        p
        for p in psutil.Process(service.process.pid).children()
        if "services.gateway" in " ".join(p.cmdline()) and "--listen-fd" in " ".join(p.cmdline())
    ]
    assert len(gateways) == 2, [p.cmdline()[:4] for p in gateways]
    model = httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["id"]
    with ThreadPoolExecutor(8) as pool:
        finishes = list(pool.map(lambda i: completion(base_url, model, i), range(REQUESTS)))
    assert finishes == ["length"] * REQUESTS
    # Every scrape, whichever process answers it (a new connection each), sees all requests.
    for _ in range(8):
        text = httpx.get(f"{base_url}/metrics", timeout=30).text
        assert successes(text) == REQUESTS
        assert re.search(r"^cleave_gateway_queue_depth 0\.0$", text, re.MULTILINE)
    # Both took requests: each process's own counter file in the shared folder has some.
    served = [_own_successes(p) for p in gateways]
    assert all(count > 0 for count in served) and sum(served) == REQUESTS, served


def _own_successes(process: psutil.Process) -> float:
    """The requests one process counted: its own file in the folder the processes share."""
    own = Path(process.environ()["PROMETHEUS_MULTIPROC_DIR"]) / f"counter_{process.pid}.db"
    total = 0.0
    for metric in MultiProcessCollector.merge([str(own)], accumulate=False):
        for sample in metric.samples:
            if sample.name == "vllm:request_success_total":
                total += sample.value
    return total
