"""Request migration on a real 1p2d stack (SmolLM2, float32): greedy streams in flight when one
decode worker is SIGKILLed (its whole process tree) all complete, each with exactly the text
and token count of an uninterrupted run of the same prompts, a sampled n = 2 stream on that
worker completes both sequences to their length, and the gateway counts the moves
(libs/gateway/serving/migration.py); a worker continues a moved structured-output or penalized
request with the tokens of an uninterrupted run. Two decode workers share the decode core, so
the streams are kept few and short."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import jsonschema
import psutil
import pytest

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.config.groups import DEFAULT_SHUTDOWN_GRACE_S
from tests.e2e.harness import Service
from tests.e2e.stack import (
    kill_worker,
    listening_ports,
    stack_blocking_channel,
    start_gateway_stack,
    stop_gateway_stack,
)

MAX_TOKENS = 48
# The sampled stream's schema: bounded, so each document ends well within its max_tokens, and
# long enough that it is still being written when the worker is killed.
FACT = {"type": "string", "minLength": 20, "maxLength": 40}
CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "facts": {"type": "array", "items": FACT, "minItems": 4, "maxItems": 4},
    },
    "required": ["city", "facts"],
    "additionalProperties": False,
}
CITY_PROMPT = "Give four facts about Paris as JSON."
SAMPLED: dict[str, object] = {
    "n": 2,
    "temperature": 1.0,
    "seed": 5,
    "max_tokens": 600,
    "ignore_eos": False,
    "structured_outputs": {"json": CITY, "disable_any_whitespace": True},
}
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
        "1p2d", tmp_path_factory.mktemp("cache"), "--max-model-len", "1024", "--migration-limit", "2",
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
    finishes: dict[int, str] = field(default_factory=dict)  # by choice index (n > 1)
    texts: dict[int, str] = field(default_factory=dict)


def stream_chat(
    base_url: str, model: str, prompt: str, seen: Stream, extra: dict[str, object] | None = None
) -> Stream:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        # Every stream runs its full length, so all are still generating when the worker dies.
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        **(extra or {}),
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
                seen.texts[choice["index"]] = seen.texts.get(choice["index"], "") + choice["delta"].get(
                    "content", ""
                )
                seen.token_events += 1 if choice["delta"].get("content") or choice["finish_reason"] else 0
                seen.finish_reason = choice["finish_reason"] or seen.finish_reason
                if choice["finish_reason"]:
                    seen.finishes[choice["index"]] = choice["finish_reason"]
    return seen


def run_streams(
    base_url: str,
    model: str,
    during: threading.Event | None = None,
    requests: list[tuple[str, dict[str, object]]] | None = None,
) -> list[Stream]:
    """`requests` (prompt, extra body fields; default PROMPTS) streamed at once; `during` is
    set once every stream received KILL_AFTER_TOKENS."""
    requests = requests or [(p, {}) for p in PROMPTS]
    streams = [Stream() for _ in requests]
    with ThreadPoolExecutor(len(requests)) as pool:
        futures = [
            pool.submit(stream_chat, base_url, model, p, s, extra)
            for (p, extra), s in zip(requests, streams, strict=True)
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
    with stack_blocking_channel(address) as channel:
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
    # A sampled n = 2 structured-output stream first, alone, so its worker is known (the one
    # running its two sequences): that worker is killed, with the greedy streams beside it.
    sampled = Stream()
    sampled_thread = threading.Thread(
        target=stream_chat, args=(base_url, model, CITY_PROMPT, sampled, SAMPLED)
    )
    sampled_thread.start()
    deadline = time.monotonic() + 120
    while sampled.token_events < 2:
        assert time.monotonic() < deadline and not sampled.errors, sampled
        time.sleep(0.05)
    victim = max((str(w["address"]) for w in decodes), key=running)
    reached = threading.Event()
    killed: list[str] = []
    killed_at: list[float] = []
    killed_mid_sampled: list[bool] = []

    def kill_when_reached() -> None:
        reached.wait(300)
        killed_mid_sampled.append(not sampled.done)
        kill_worker(gateway, victim)
        killed.append(victim)
        killed_at.append(time.monotonic())

    killer = threading.Thread(target=kill_when_reached)
    killer.start()
    moved = run_streams(base_url, model, during=reached)
    killer.join()
    sampled_thread.join(300)
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
    # Both sampled sequences went on to the end of their documents, each valid JSON of the
    # schema: the new worker's grammar went on from where the killed one's was.
    assert killed_mid_sampled == [True], "the n = 2 stream ended before the kill"
    assert sampled.done and not sampled.errors, sampled
    assert sampled.finishes == {0: "stop", 1: "stop"}, sampled
    for text in sampled.texts.values():
        jsonschema.validate(json.loads(text), CITY)
    # The victim had streams in flight, the n = 2 one among them: each moved at most once.
    assert 1 <= migrated <= len(PROMPTS) + 1


def generate(address: str, request: worker_pb2.GenerateRequest) -> list[int]:
    """A worker's Generate stream, called directly: the tokens it sent."""
    tokens: list[int] = []
    with stack_blocking_channel(address) as channel:
        for response in worker_pb2_grpc.WorkerStub(channel).Generate(request, timeout=120):
            assert response.WhichOneof("kind") != "error", response
            tokens.extend(response.chunk.token_ids)
    return tokens


def test_a_moved_greedy_json_schema_request_continues_with_the_uninterrupted_tokens(
    stack: tuple[Service, str],
) -> None:
    """The worker side of a structured-output move, on a real engine: a request continued from
    the first k tokens of an uninterrupted greedy run (GenerateRequest.sequences) sends exactly
    the rest of that run, and the whole is a valid document: the grammar went on where it was
    (libs/worker/vllm_grammar_prefix.py), it did not start over after the moved tokens."""
    _, base_url = stack
    model = served_model(base_url)
    (worker,) = [str(w["address"]) for w in decode_workers(base_url) if w["healthy"]][:1]
    messages = [{"role": "user", "content": CITY_PROMPT}]
    prompt = httpx.post(
        f"{base_url}/tokenize", json={"model": model, "messages": messages}, timeout=30
    ).json()
    sampling = common_pb2.SamplingParams(max_tokens=200, temperature=0)
    sampling.structured_output.json_schema = json.dumps(CITY)
    sampling.structured_output.disable_any_whitespace = True
    request = worker_pb2.GenerateRequest(prompt_token_ids=prompt["tokens"], sampling=sampling)
    whole = generate(worker, request)
    cut = len(whole) // 3
    request.sequences.add(index=0, token_ids=whole[:cut])
    rest = generate(worker, request)
    assert rest == whole[cut:], (cut, whole, rest)
    text = httpx.post(f"{base_url}/detokenize", json={"model": model, "tokens": whole}, timeout=30).json()[
        "prompt"
    ]
    jsonschema.validate(json.loads(text[: text.rindex("}") + 1]), CITY)  # less the end-of-turn token


def test_a_moved_request_with_penalties_continues_with_the_uninterrupted_tokens(
    stack: tuple[Service, str],
) -> None:
    """The worker side of a penalized request's move, on a real engine: continued from the first
    k tokens of an uninterrupted greedy run with presence, frequency and repetition penalties
    (GenerateRequest.sequences), it sends exactly the rest of that run, because the moved tokens
    count as output for the penalties (libs/worker/vllm_moved_penalties.py); continued as a
    plain longer prompt, it would not."""
    _, base_url = stack
    model = served_model(base_url)
    (worker,) = [str(w["address"]) for w in decode_workers(base_url) if w["healthy"]][:1]
    messages = [{"role": "user", "content": "Name as many animals as you can."}]
    prompt = httpx.post(
        f"{base_url}/tokenize", json={"model": model, "messages": messages}, timeout=30
    ).json()["tokens"]
    sampling = common_pb2.SamplingParams(
        max_tokens=32, temperature=0,
        presence_penalty=0.8, frequency_penalty=0.8, repetition_penalty=1.1,
    )  # fmt: skip
    request = worker_pb2.GenerateRequest(prompt_token_ids=prompt, sampling=sampling)
    whole = generate(worker, request)
    cut = len(whole) // 2
    request.sequences.add(index=0, token_ids=whole[:cut])
    assert generate(worker, request) == whole[cut:], (cut, whole)
    sampling.max_tokens -= cut
    plain = worker_pb2.GenerateRequest(prompt_token_ids=[*prompt, *whole[:cut]], sampling=sampling)
    assert generate(worker, plain) != whole[cut:]


# A drain lets every stream finish where it is, structured output included (it could move, but
# a graceful stop moves nothing). A schema whose answers outrun MAX_TOKENS, so these streams
# run to their length.
FACTS = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "facts": {"type": "array", "items": {"type": "string"}, "minItems": 4},
    },
    "required": ["city", "facts"],
}
STRUCTURED: dict[str, object] = {
    "response_format": {"type": "json_schema", "json_schema": {"name": "facts", "schema": FACTS}},
    "ignore_eos": False,
}
DRAIN_REQUESTS: list[tuple[str, dict[str, object]]] = [(p, {}) for p in PROMPTS] + [
    (f"Give four facts about {city} as JSON.", STRUCTURED) for city in ("Paris", "Tokyo", "Nairobi", "Lima")
]


def logged_exit_codes(gateway: Service) -> list[int]:
    """The exit codes of the gateway's children, as its stack supervisor logs them ("local
    service exited"): a worker is the gateway's child, not the test's, so only the gateway
    learns its exit status."""
    text = gateway.running.log_path.read_text(errors="replace")
    return [int(code) for code in re.findall(r'local service exited.*?\bcode"?\s*[=:]\s*(-?\d+)', text)]


def worker_process(gateway: Service, address: str) -> psutil.Process:
    port = int(address.rsplit(":", 1)[1])
    for child in psutil.Process(gateway.process.pid).children():
        if port in listening_ports(child):
            return child
    raise AssertionError(f"no worker process listens on {address}")


def test_a_decode_worker_stopped_with_sigterm_finishes_its_streams_within_its_grace(
    stack: tuple[Service, str],
) -> None:
    """Last in this module: it stops a decode worker for good (an exit 0 is not restarted).
    SIGTERM to the worker process alone, as Kubernetes or Docker's init sends it: its 8 greedy
    streams, text and json_schema, all finish with the text of an uninterrupted run, none errs,
    and the worker exits within its --shutdown-grace-s."""
    gateway, base_url = stack
    model = served_model(base_url)
    uninterrupted = run_streams(base_url, model, requests=DRAIN_REQUESTS)
    for s in uninterrupted:
        assert s.done and not s.errors and s.finish_reason == "length", s

    reached = threading.Event()
    stopped: dict[str, float | int | str | None] = {}

    def sigterm_when_reached() -> None:
        reached.wait(300)
        alive = [w for w in decode_workers(base_url) if w["healthy"]]
        victim = max((str(w["address"]) for w in alive), key=running)
        process = worker_process(gateway, victim)
        stopped["running"] = running(victim)
        exits_before = len(logged_exit_codes(gateway))
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=DEFAULT_SHUTDOWN_GRACE_S + 60)  # not our child: waits, gives no code
        stopped["seconds"] = time.monotonic() - signalled
        stopped["address"] = victim
        deadline = time.monotonic() + 10  # the gateway's supervisor reaps it within a second or so
        while len(codes := logged_exit_codes(gateway)) <= exits_before and time.monotonic() < deadline:
            time.sleep(0.2)
        stopped["exit"] = codes[exits_before] if len(codes) > exits_before else None

    stopper = threading.Thread(target=sigterm_when_reached)
    stopper.start()
    drained = run_streams(base_url, model, during=reached, requests=DRAIN_REQUESTS)
    stopper.join()
    print(f"SIGTERM to {stopped['address']} running {stopped['running']} streams: exit {stopped['exit']} after "
          f"{stopped['seconds']:.1f} s")  # fmt: skip
    assert isinstance(stopped["running"], int) and stopped["running"] > 0
    for before, after in zip(uninterrupted, drained, strict=True):
        assert after.done and not after.errors, after
        assert (after.text, after.finish_reason, after.usage) == (
            before.text,
            before.finish_reason,
            before.usage,
        )
    assert stopped["exit"] == 0
    assert isinstance(stopped["seconds"], float) and stopped["seconds"] <= DEFAULT_SHUTDOWN_GRACE_S
