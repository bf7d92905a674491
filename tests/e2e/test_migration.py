"""Request migration on a real 2p2d stack (SmolLM2, float32): greedy streams in flight when one
decode worker is SIGKILLed (its whole process tree) all complete, each with exactly the text
and token count of an uninterrupted run of the same prompts, and the gateway counts the moves
(libs/gateway/migration.py). Two decode workers share the decode core, so the streams are kept
few and short."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
import httpx
import pytest

from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from tests.e2e.harness import Service
from tests.e2e.stack import kill_worker, start_gateway_stack, stop_gateway_stack

MAX_TOKENS = 48
# Tokens every stream has received before the kill: well inside MAX_TOKENS, so the killed
# worker's streams are mid-way.
KILL_AFTER_TOKENS = 8
PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how rainbows form.",
    "Describe a walk through a forest in autumn.",
    "What should a beginner know about baking bread?",
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, str]]:
    service, base_url = start_gateway_stack(
        "2p2d", tmp_path_factory.mktemp("cache"), "--max-model-len", "1024", "--migration-limit", "2",
        "--restart-limit", "0",  # the killed decode stays dead: its streams must move
    )  # fmt: skip
    try:
        yield service, base_url
    finally:
        stop_gateway_stack(service)


@dataclass
class Stream:
    """One streamed chat completion as the client saw it."""

    text: str = ""
    token_events: int = 0
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    errors: list[dict[str, object]] = field(default_factory=list)
    done: bool = False


def stream_chat(base_url: str, model: str, prompt: str, seen: Stream) -> Stream:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        # Every stream runs its full length, so all are still generating when the worker dies.
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=300) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                seen.done = True
                break
            event = json.loads(data)
            if "error" in event:
                seen.errors.append(event["error"])
                continue
            if event.get("usage"):
                seen.usage = event["usage"]
            for choice in event["choices"]:
                seen.text += choice["delta"].get("content", "")
                seen.token_events += 1 if choice["delta"].get("content") or choice["finish_reason"] else 0
                seen.finish_reason = choice["finish_reason"] or seen.finish_reason
    return seen


def run_streams(base_url: str, model: str, during: threading.Event | None = None) -> list[Stream]:
    """PROMPTS streamed at once; `during` is set once every stream received KILL_AFTER_TOKENS."""
    streams = [Stream() for _ in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        futures = [
            pool.submit(stream_chat, base_url, model, p, s) for p, s in zip(PROMPTS, streams, strict=True)
        ]
        if during is not None:
            deadline = time.monotonic() + 240
            while min(s.token_events for s in streams) < KILL_AFTER_TOKENS:
                assert time.monotonic() < deadline, [s.token_events for s in streams]
                assert not any(f.done() for f in futures), [f.exception() for f in futures if f.done()]
                time.sleep(0.05)
            during.set()
        return [f.result() for f in futures]


def served_model(base_url: str) -> str:
    return str(httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["id"])


def decode_workers(base_url: str) -> list[dict[str, object]]:
    workers = httpx.get(f"{base_url}/health", timeout=10).json()["workers"]
    return [w for w in workers if w["role"] == "decode"]


def metric(base_url: str, series: str) -> float:
    for line in httpx.get(f"{base_url}/metrics", timeout=10).text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def running(address: str) -> int:
    """Requests the worker's engine is running now (its own stats, not the gateway's last poll)."""
    with grpc.insecure_channel(address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        return stub.GetStats(worker_pb2.GetStatsRequest(), timeout=10).num_running


def test_streams_on_a_killed_decode_worker_continue_on_the_other_unchanged(
    stack: tuple[Service, str],
) -> None:
    gateway, base_url = stack
    model = served_model(base_url)
    decodes = decode_workers(base_url)
    assert len(decodes) == 2 and all(w["healthy"] for w in decodes), decodes

    uninterrupted = run_streams(base_url, model)
    for s in uninterrupted:
        assert s.done and not s.errors and s.finish_reason == "length", s
        assert s.usage["completion_tokens"] == MAX_TOKENS, s.usage

    migrated_before = metric(base_url, "cleave_gateway_migrations_total")
    reached = threading.Event()
    killed: list[str] = []
    killed_at: list[float] = []

    def kill_when_reached() -> None:
        reached.wait(300)
        # The decode worker running the most of the streams (routing may put all on one).
        victim = max((str(w["address"]) for w in decodes), key=running)
        kill_worker(gateway, victim)
        killed.append(victim)
        killed_at.append(time.monotonic())

    killer = threading.Thread(target=kill_when_reached)
    killer.start()
    moved = run_streams(base_url, model, during=reached)
    killer.join()
    finished_after = time.monotonic() - killed_at[0]
    migrated = metric(base_url, "cleave_gateway_migrations_total") - migrated_before
    print(
        f"killed {killed[0]}; {migrated:.0f} stream(s) moved; all done {finished_after:.1f} s after the kill"
    )

    for before, after in zip(uninterrupted, moved, strict=True):
        assert after.done and not after.errors, after
        assert after.finish_reason == "length"
        assert after.usage["completion_tokens"] == MAX_TOKENS
        assert after.usage["prompt_tokens"] == before.usage["prompt_tokens"]
        assert after.text == before.text
    # The victim had streams in flight: at least one moved (each at most once: one kill).
    assert 1 <= migrated <= len(PROMPTS)
