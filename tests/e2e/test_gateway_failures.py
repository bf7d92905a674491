"""A real 2p1d stack with SmolLM2 and a kvstore, round-robin routing: stored prompt prefixes
are loaded instead of computed, by the decode worker when the gateway skips prefill and by
the other prefill worker otherwise (their counters say how much), with the same greedy
output. Then worker failures: a killed prefill worker is ejected and requests
succeed on the other one; a decode worker killed mid-stream gives the client an error event
within seconds, and the gateway stops routing to it.

The tests share one stack and run in file order (the last leaves no decode worker).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import psutil
import pytest

from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.tokenization.tokenizer import Tokenizer, TokenizerConfig
from tests.e2e.harness import Service
from tests.e2e.prompts import question, shared_prefix
from tests.e2e.stack import start_gateway_stack, stop_gateway_stack, stored_chunks

PREFIX_TOKENS = 1900

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, str]]:
    service, base_url = start_gateway_stack(
        "2p1d", tmp_path_factory.mktemp("cache"), "--kvstore", "--kvstore-cpu-bytes", "512MiB",
        "--routing", "round_robin", "--max-model-len", "4096",
    )  # fmt: skip
    try:
        yield service, base_url
    finally:
        stop_gateway_stack(service)


def workers(base_url: str, role: str) -> list[dict[str, object]]:
    return [w for w in httpx.get(f"{base_url}/health", timeout=10).json()["workers"] if w["role"] == role]


def child_port(gateway: Service, module: str) -> str:
    """The --port of the local stack's child running `module`."""
    for child in psutil.Process(gateway.process.pid).children():
        cmdline = child.cmdline()
        if module in cmdline:
            return cmdline[cmdline.index("--port") + 1]
    raise AssertionError(f"no {module} in the local stack")


def worker_stats(address: str) -> worker_pb2.WorkerStats:
    with grpc.insecure_channel(address) as channel:
        return worker_pb2_grpc.WorkerStub(channel).GetStats(worker_pb2.GetStatsRequest(), timeout=10)


def test_stored_prefixes_are_loaded_not_computed(stack: tuple[Service, str], model_dir: Path) -> None:
    """Cold on one prefill worker; the same prefix with a long new tail goes through the other
    prefill worker, which loads the prefix from the kvstore; the first prompt again skips
    prefill (the kvstore holds all but its last 120 tokens) and gives the same greedy output."""
    gateway, base_url = stack
    tokenizer = Tokenizer.from_config(TokenizerConfig(path=model_dir))
    prefix = shared_prefix(tokenizer, seed=3, tokens=PREFIX_TOKENS)
    prompt = prefix + question(tokenizer, "Which word comes first?")
    long_tail = prefix + shared_prefix(tokenizer, seed=4, tokens=300) + question(tokenizer, "And last?")
    model = served_model(base_url)
    addresses = {role: [str(w["address"]) for w in workers(base_url, role)] for role in ("prefill", "decode")}
    everyone = addresses["prefill"] + addresses["decode"]

    def complete(ids: list[int]) -> str:
        body = {"model": model, "prompt": ids, "max_tokens": 16, "temperature": 0}
        response = httpx.post(f"{base_url}/v1/completions", json=body, timeout=300)
        assert response.status_code == 200, response.text
        time.sleep(1.5)  # vLLM's stat loggers run after the step
        return str(response.json()["choices"][0]["text"])

    def deltas(before: dict[str, worker_pb2.WorkerStats]) -> tuple[dict[str, int], ...]:
        """Prompt tokens per worker: computed, loaded from the kvstore, hit in its own cache."""
        after = {a: worker_stats(a) for a in everyone}
        return (
            {a: after[a].prompt_tokens_computed - before[a].prompt_tokens_computed for a in everyone},
            {a: after[a].kvstore.tokens_loaded - before[a].kvstore.tokens_loaded for a in everyone},
            {
                a: after[a].prompt_tokens_local_cache_hit - before[a].prompt_tokens_local_cache_hit
                for a in everyone
            },
        )

    before = {a: worker_stats(a) for a in everyone}
    cold = complete(prompt)
    computed, _, _ = deltas(before)
    cold_worker = max(addresses["prefill"], key=lambda a: computed[a])
    assert computed[cold_worker] == len(prompt)
    kvstore = f"127.0.0.1:{child_port(gateway, 'services.kvstore.main')}"
    full_chunks = len(prompt) // 256
    assert asyncio.run(stored_chunks(kvstore, at_least=full_chunks)) >= full_chunks

    before = {a: worker_stats(a) for a in everyone}
    complete(long_tail)
    computed, loaded, _ = deltas(before)
    print(
        f"same prefix, {len(long_tail) - PREFIX_TOKENS} new tokens: computed {computed}, from the kvstore {loaded}"
    )
    other = next(a for a in addresses["prefill"] if a != cold_worker)
    assert loaded[other] >= 0.9 * PREFIX_TOKENS and computed[other] == len(long_tail) - loaded[other]

    # The decode worker reuses the prefix from its own prefix cache (it received this
    # prompt's KV over NIXL the first time) or from the kvstore; no prefill worker computes.
    before = {a: worker_stats(a) for a in everyone}
    warm = complete(prompt)
    computed, loaded, local = deltas(before)
    print(f"same prompt again: computed {computed}, from the kvstore {loaded}, from local caches {local}")
    decode = addresses["decode"][0]
    assert all(computed[a] == 0 for a in addresses["prefill"]), computed
    reused = loaded[decode] + local[decode]
    assert reused >= 0.9 * PREFIX_TOKENS and computed[decode] == len(prompt) - reused
    assert warm == cold


def kill_worker(gateway: Service, address: str) -> None:
    """SIGKILL the worker serving `address` and its vLLM engine processes (its process group)."""
    port = address.rsplit(":", 1)[1]
    for child in psutil.Process(gateway.process.pid).children():
        try:
            cmdline = child.cmdline()
        except psutil.Error:  # e.g. the worker killed by the previous test, not yet reaped
            continue
        if "services.worker.main" in cmdline and port in cmdline:
            os.killpg(child.pid, signal.SIGKILL)
            return
    raise AssertionError(f"no worker process listens on {address}")


def chat(base_url: str, model: str, **extra: object) -> httpx.Response:
    body = {"model": model, "messages": QUESTION, "max_tokens": 8, "temperature": 0, **extra}
    return httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)


def served_model(base_url: str) -> str:
    return str(httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["id"])


def wait_until_unhealthy(base_url: str, address: str, timeout_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if not any(w["healthy"] for w in workers(base_url, "prefill") + workers(base_url, "decode")
                   if w["address"] == address):  # fmt: skip
            return time.monotonic() - started
        time.sleep(0.2)
    raise AssertionError(f"{address} still routed to after {timeout_s} s")


def test_killed_prefill_worker_is_ejected_and_requests_succeed(stack: tuple[Service, str]) -> None:
    gateway, base_url = stack
    model = served_model(base_url)
    prefills = workers(base_url, "prefill")
    assert len(prefills) == 2 and all(w["healthy"] for w in prefills), prefills
    baseline = chat(base_url, model)
    assert baseline.status_code == 200, baseline.text

    victim = str(prefills[0]["address"])
    kill_worker(gateway, victim)
    # Requests sent right away may still pick the dead worker: the gateway retries them on
    # the other prefill worker, so every one must succeed with the same greedy answer.
    answers = [chat(base_url, model) for _ in range(4)]
    assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
    texts = {a.json()["choices"][0]["message"]["content"] for a in answers}
    assert texts == {baseline.json()["choices"][0]["message"]["content"]}

    ejected_after = wait_until_unhealthy(base_url, victim, timeout_s=10)
    print(f"killed prefill worker ejected within {ejected_after:.1f} s of the requests")
    survivors = [w for w in workers(base_url, "prefill") if w["healthy"]]
    assert [w["address"] for w in survivors] == [prefills[1]["address"]]


def test_decode_killed_mid_stream_gives_an_error_event(stack: tuple[Service, str]) -> None:
    gateway, base_url = stack
    model = served_model(base_url)
    (decode,) = workers(base_url, "decode")
    body = {"model": model, "messages": QUESTION, "max_tokens": 1000, "ignore_eos": True, "stream": True}
    events: list[str] = []
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        killed_at = None
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[len("data: ") :])
            if len(events) == 5 and killed_at is None:
                kill_worker(gateway, str(decode["address"]))
                killed_at = time.monotonic()
        assert killed_at is not None, events
        error_after = time.monotonic() - killed_at
    print(f"client got the error event {error_after:.1f} s after the decode worker was killed")
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "worker_failed" and "decode" in error["message"], error
    assert error_after < 10

    wait_until_unhealthy(base_url, str(decode["address"]), timeout_s=10)
    refused = chat(base_url, model)
    assert refused.status_code == 503, refused.text
    assert "decode" in refused.json()["error"]["message"]
