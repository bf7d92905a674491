"""The local stack's process lifecycle on one pd stack started by the gateway, as a user does
(the stack test_fuzz_http fuzzed before; tests/e2e/conftest.py: edge_stack):
a worker whose vLLM engine dies fails the request in flight with an error event, stops
serving and exits 3; the gateway's stack restarts it on the same address and the next chat
completion succeeds; then SIGKILL of the gateway leaves no process of the stack behind
(tokenizer, worker, its engine), 5 s later at most.

Child processes dying with a SIGKILLed parent is also covered without a model, for the chain
run_batch -> gateway -> worker -> engine, by tests/libs/stack/test_reaper.py.
"""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import psutil
import pytest

from tests.e2e.harness import Service

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def stack(edge_stack: tuple[Service, str]) -> tuple[Service, str]:
    """The pd stack test_fuzz_http fuzzed (tests/e2e/conftest.py): these tests end it."""
    return edge_stack


def worker_and_engine(gateway: Service) -> tuple[psutil.Process, psutil.Process]:
    (worker,) = [
        c for c in psutil.Process(gateway.process.pid).children() if "services.worker.main" in c.cmdline()
    ]
    engines = [c for c in worker.children() if "EngineCore" in c.name() + " ".join(c.cmdline())]
    assert len(engines) == 1, [(c.pid, c.name(), c.cmdline()) for c in worker.children()]
    return worker, engines[0]


def chat(base_url: str, **extra: object) -> httpx.Response:
    body = {"model": served_model(base_url), "messages": QUESTION, "max_tokens": 8, "temperature": 0, **extra}
    return httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)


def served_model(base_url: str) -> str:
    return str(httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["id"])


def metric(base_url: str, series: str) -> float:
    for line in httpx.get(f"{base_url}/metrics", timeout=10).text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_dead_engine_fails_the_request_in_flight_and_its_worker_is_restarted(
    stack: tuple[Service, str],
) -> None:
    gateway, base_url = stack
    baseline = chat(base_url)
    assert baseline.status_code == 200, baseline.text
    worker, engine = worker_and_engine(gateway)
    (before,) = httpx.get(f"{base_url}/health", timeout=10).json()["workers"]

    body = {"model": served_model(base_url), "messages": QUESTION, "max_tokens": 400, "ignore_eos": True,
            "stream": True}  # fmt: skip
    events: list[str] = []
    killed_at = None
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[len("data: ") :])
            if len(events) == 5 and killed_at is None:
                engine.send_signal(signal.SIGKILL)  # the engine alone; its worker lives on
                killed_at = time.monotonic()
    assert killed_at is not None, events
    print(f"stream ended {time.monotonic() - killed_at:.1f} s after the engine was killed")
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "worker_failed", error

    # The worker stopped serving and exited 3 (not a clean 0: it is to be restarted).
    worker.wait(timeout=60)
    exits = [line for line in gateway.log_tail(400).splitlines() if "local service exited" in line]
    assert len(exits) == 1 and "code=3" in exits[0] and "service=pd-0" in exits[0], exits

    # Restarted on the address the gateway knows; it answers once its model has loaded.
    deadline = time.monotonic() + 300
    while (reply := chat(base_url)).status_code != 200:
        assert time.monotonic() < deadline, reply.text
        time.sleep(1)
    assert reply.json()["choices"][0]["message"] == baseline.json()["choices"][0]["message"]
    (after,) = httpx.get(f"{base_url}/health", timeout=10).json()["workers"]
    assert after["address"] == before["address"] and after["healthy"]
    assert metric(base_url, 'cleave_stack_restarts_total{service="pd-0"}') == 1.0
    assert worker_and_engine(gateway)[0].pid != worker.pid


def test_sigkill_of_the_gateway_leaves_no_process_of_its_stack(stack: tuple[Service, str]) -> None:
    gateway, _base_url = stack
    worker, engine = worker_and_engine(gateway)
    tree = psutil.Process(gateway.process.pid).children(recursive=True)
    assert {worker.pid, engine.pid} <= {p.pid for p in tree}
    names = sorted(p.name() for p in tree)
    os.kill(gateway.process.pid, signal.SIGKILL)
    gateway.process.wait()
    deadline = time.monotonic() + 5
    while (left := [p for p in tree if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"left running after the gateway's SIGKILL: {[(p.pid, p.cmdline()) for p in left]}"
    print(f"{len(tree)} processes gone with the gateway: {names}")
