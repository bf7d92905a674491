"""Fuzzing the gateway's HTTP API on a real pd stack (SmolLM2) from its own OpenAPI document:
request bodies that follow the schema and bodies broken on purpose (wrong types, numbers far
out of range, unknown fields, missing fields, deep nesting, not an object), plus hand-made
malformed bytes (invalid UTF-8, truncated JSON, 100,000-deep arrays, NaN/Infinity literals,
lone surrogates, megabyte prompts). For every one: never a 5xx, a 4xx is always an OpenAI
error object, no request hangs. Afterwards a valid request succeeds, every worker is healthy
and idle (none was ejected). max_tokens is kept at 4 or less so that the examples that reach
the model stay cheap; the examples are fixed (derandomized) so that CI runs the same ones."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.harness import Service
from tests.e2e.stack import start_gateway_stack, stop_gateway_stack
from tests.fuzz.events import outcome
from tests.fuzz.openapi import OpenApi
from tools.soak.memory import TreeSampler
from tools.soak.report import as_json, as_text
from tools.soak.runner import SoakOptions, soak
from tools.soak.workload import Mix

MAX_MODEL_LEN = 512
MAX_TOKENS = 4
TIMEOUT_S = 60.0  # per request, all bytes included: more is a hang
PATHS = ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"]
GENERATING = PATHS[:2]

FUZZ = settings(
    max_examples=40,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


class Gateway:
    def __init__(self, service: Service, base_url: str) -> None:
        self.service = service
        self.base_url = base_url
        self.client = httpx.Client(timeout=httpx.Timeout(TIMEOUT_S))
        self.model = self.client.get(f"{base_url}/v1/models").json()["data"][0]["id"]
        self.openapi = OpenApi(self.client.get(f"{base_url}/openapi.json").json())
        self.statuses: Counter[str] = Counter()  # "path status" -> requests, printed at the end


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    service, base_url = start_gateway_stack(
        "pd", tmp_path_factory.mktemp("cache"), "--max-model-len", str(MAX_MODEL_LEN)
    )
    try:
        gateway = Gateway(service, base_url)
        yield gateway
        gateway.client.close()
    finally:
        stop_gateway_stack(service)


def send(gateway: Gateway, path: str, content: bytes, content_type: str | None = "application/json") -> None:
    """Posts `content`, reads the whole answer within TIMEOUT_S and checks its shape."""
    headers = {"content-type": content_type} if content_type else {}
    started = time.monotonic()
    with gateway.client.stream("POST", gateway.base_url + path, content=content, headers=headers) as response:
        body = response.read()
    elapsed = time.monotonic() - started
    shown = content[:300]
    assert elapsed < TIMEOUT_S, f"{path} took {elapsed:.0f}s for {shown!r}"
    assert response.status_code < 500, f"{path} {response.status_code} {body[:500]!r} for {shown!r}"
    outcome(f"{path} {response.status_code}")
    gateway.statuses[f"{path} {response.status_code}"] += 1
    if response.status_code >= 400:
        check_error_object(json.loads(body), f"{path} {response.status_code} for {shown!r}")
    elif response.headers.get("content-type", "").startswith("text/event-stream"):
        check_stream(body.decode(), f"{path} for {shown!r}")
    else:
        json.loads(body)


def check_error_object(body: Any, what: str) -> None:
    assert isinstance(body, dict) and set(body) == {"error"}, f"not an OpenAI error object: {body!r} ({what})"
    error = body["error"]
    assert {"message", "type", "param", "code"} <= set(error), f"{error!r} ({what})"
    assert isinstance(error["message"], str) and error["message"], what
    assert isinstance(error["type"], str) and error["type"], what
    assert error["param"] is None or isinstance(error["param"], str), what
    assert error["code"] is None or isinstance(error["code"], str | int), what


def check_stream(text: str, what: str) -> None:
    events = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", f"stream did not end with [DONE]: {text[-300:]!r} ({what})"
    for data in events[:-1]:
        chunk = json.loads(data)
        if "error" in chunk:
            check_error_object(chunk, what)


def as_json_bytes(value: Any) -> bytes:
    return json.dumps(value).encode()


@st.composite
def tamed(
    draw: st.DrawFn, bodies: st.SearchStrategy[Any], gateway: Gateway, path: str, trim: bool = False
) -> Any:
    """Keeps a generating request cheap (max_tokens <= 4), mostly names the served model, and
    with `trim`, half the time keeps only a few optional fields (each may be refused on its
    own), so that examples get past validation to the tokenizer and the worker."""
    body = draw(bodies)
    if not isinstance(body, dict):
        return body
    body = dict(body)
    required = set(gateway.openapi.body_schema(path).get("required", []))
    optional = sorted(k for k in body if k not in required)
    if trim and len(optional) > 0 and draw(st.booleans()):
        keep = draw(st.sets(st.sampled_from(optional), max_size=3))
        body = {k: v for k, v in body.items() if k in required or k in keep}
    if isinstance(body.get("model"), str) and draw(st.integers(0, 9)) < 8:
        body["model"] = gateway.model
    if path not in GENERATING:
        return body
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and MAX_TOKENS < value <= 100 * MAX_MODEL_LEN
        ):
            body[key] = value % MAX_TOKENS + 1
    if "max_tokens" not in body and "max_completion_tokens" not in body:
        body["max_tokens"] = MAX_TOKENS  # unset means "until the context is full"
    return body


@pytest.mark.parametrize("path", PATHS)
def test_bodies_that_follow_the_schema(gateway: Gateway, path: str) -> None:
    @FUZZ
    @given(body=tamed(gateway.openapi.valid(gateway.openapi.body_schema(path)), gateway, path, trim=True))
    def run(body: Any) -> None:
        send(gateway, path, as_json_bytes(body))

    run()


@pytest.mark.parametrize("path", PATHS)
def test_broken_bodies(gateway: Gateway, path: str) -> None:
    @settings(FUZZ, max_examples=60)
    @given(body=tamed(gateway.openapi.broken(gateway.openapi.body_schema(path)), gateway, path))
    def run(body: Any) -> None:
        send(gateway, path, as_json_bytes(body))

    run()


DEEP = 100_000
# A body FastAPI cannot parse (bad UTF-8, JSON nested past Python's recursion limit, an
# integer of more than 4300 digits) is still an OpenAI error object (services/gateway/app.py).
MALFORMED: list[Any] = [
    pytest.param(
        "invalid UTF-8 in a string",
        b'{"model": "M", "prompt": "fox \xff\xfe jumps", "max_tokens": 2}',
        id="invalid UTF-8 in a string",
    ),
    pytest.param(
        "invalid UTF-8 outside strings",
        b'{"model": "M", \xc3\x28 "prompt": "fox"}',
        id="invalid UTF-8 outside strings",
    ),
    ("truncated JSON", b'{"model": "M", "prompt": "the quick brown'),
    ("empty body", b""),
    ("JSON null", b"null"),
    ("a JSON string", b'"fox"'),
    pytest.param(
        "deeply nested prompt",
        b'{"model": "M", "prompt": ' + b"[" * DEEP + b"]" * DEEP + b"}",
        id="deeply nested prompt",
    ),
    pytest.param("deeply nested body", b"[" * DEEP + b"]" * DEEP, id="deeply nested body"),
    pytest.param(
        "deeply nested objects",
        b'{"a":' * DEEP + b"1" + b"}" * DEEP,
        id="deeply nested objects",
    ),
    ("NaN temperature", b'{"model": "M", "prompt": "fox", "max_tokens": 2, "temperature": NaN}'),
    ("Infinity temperature", b'{"model": "M", "prompt": "fox", "max_tokens": 2, "temperature": Infinity}'),
    ("-Infinity penalty", b'{"model": "M", "prompt": "fox", "max_tokens": 2, "presence_penalty": -Infinity}'),
    ("1e999 max_tokens", b'{"model": "M", "prompt": "fox", "max_tokens": 1e999}'),
    pytest.param(
        "huge integer max_tokens",
        b'{"model": "M", "prompt": "fox", "max_tokens": ' + b"9" * 5000 + b"}",
        id="huge integer max_tokens",
    ),
    ("duplicate keys", b'{"model": "M", "prompt": "fox", "max_tokens": 2, "max_tokens": "many"}'),
    ("byte order mark", b'\xef\xbb\xbf{"model": "M", "prompt": "fox", "max_tokens": 2}'),
    ("lone surrogate in prompt", b'{"model": "M", "prompt": "fox \\ud800 jumps", "max_tokens": 2}'),
    (
        "lone surrogate in chat",
        b'{"model": "M", "messages": [{"role": "user", "content": "\\udfff"}], "max_tokens": 2}',
    ),
    ("lone surrogate in stop", b'{"model": "M", "prompt": "fox", "max_tokens": 2, "stop": ["\\ud83d"]}'),
    ("NUL characters", b'{"model": "M", "prompt": "fox\\u0000\\u0000", "max_tokens": 2}'),
    ("string max_tokens", b'{"model": "M", "prompt": "fox", "max_tokens": "2"}'),
    ("a 4 MiB prompt", b'{"model": "M", "prompt": "' + b"fox " * 2**20 + b'", "max_tokens": 2}'),
    ("a million token ids", b'{"model": "M", "max_tokens": 2, "prompt": [' + b"1," * 999_999 + b"1]}"),
    (
        "ten thousand messages",
        as_json_bytes(
            {"model": "M", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}] * 10_000}
        ),
    ),
]
TOKENIZE_MALFORMED: list[tuple[str, str, bytes]] = [
    ("detokenize a negative id", "/detokenize", b'{"tokens": [-1]}'),
    ("detokenize an id past int32", "/detokenize", b'{"tokens": [1099511627776]}'),
    ("detokenize a million ids", "/detokenize", b'{"tokens": [' + b"5," * 999_999 + b"5]}"),
    (
        "tokenize prompt and messages",
        "/tokenize",
        b'{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}',
    ),
    ("tokenize neither", "/tokenize", b"{}"),
    ("tokenize a lone surrogate", "/tokenize", b'{"prompt": "\\udc00"}'),
    ("tokenize a 4 MiB prompt", "/tokenize", b'{"prompt": "' + b"fox " * 2**20 + b'"}'),
]


@pytest.mark.parametrize(
    ("what", "content"), MALFORMED, ids=[getattr(m, "id", None) or m[0] for m in MALFORMED]
)
@pytest.mark.parametrize("path", GENERATING)
def test_malformed_bytes(gateway: Gateway, path: str, what: str, content: bytes) -> None:
    send(gateway, path, content.replace(b'"M"', json.dumps(gateway.model).encode()))


@pytest.mark.parametrize(
    ("what", "path", "content"), TOKENIZE_MALFORMED, ids=[m[0] for m in TOKENIZE_MALFORMED]
)
def test_malformed_tokenize_bodies(gateway: Gateway, what: str, path: str, content: bytes) -> None:
    send(gateway, path, content)


@pytest.mark.parametrize("content_type", ["text/plain", None, "application/x-www-form-urlencoded"])
def test_wrong_content_type(gateway: Gateway, content_type: str | None) -> None:
    body = {"model": gateway.model, "prompt": "fox", "max_tokens": 2}
    send(gateway, "/v1/completions", as_json_bytes(body), content_type)


def test_afterwards_a_valid_request_succeeds_and_no_worker_was_ejected(gateway: Gateway) -> None:
    body = {"model": gateway.model, "temperature": 0, "max_tokens": 8,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]}  # fmt: skip
    response = gateway.client.post(gateway.base_url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"]
    deadline = time.monotonic() + 30  # worker stats are polled about once a second
    while True:
        workers = gateway.client.get(gateway.base_url + "/health").json()["workers"]
        if all(w["healthy"] and not w.get("running") for w in workers) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert workers and all(w["healthy"] for w in workers), workers
    assert not any(w.get("running") for w in workers), f"requests left running: {workers}"
    tracebacks = gateway.service.running.log_path.read_text(errors="replace").count("Traceback")
    print(f"tracebacks in the gateway's log after fuzzing: {tracebacks}")
    print("fuzzed requests by answer:", dict(sorted(gateway.statuses.items())))


def test_a_short_soak_after_the_fuzzing(gateway: Gateway) -> None:
    """//tools/soak for 40 s on the same stack: concurrent streams, aborts mid-stream and early
    disconnects; none hangs, none fails, and the workers end healthy and idle."""
    options = SoakOptions(
        base_url=gateway.base_url, duration_s=40, concurrency=4, stall_s=60, sample_s=2, seed=1,
        mix=Mix(max_tokens=16),
    )  # fmt: skip
    sampler = TreeSampler([gateway.service.running.pid])
    result = asyncio.run(soak(options, sampler))
    print(as_text(as_json(result, sampler, warmup_s=10)))
    assert result.hung == 0
    assert result.count("completed") > 10 and result.count("aborted") > 0
    assert result.count("error") == 0, result.errors_by_detail()
    assert not result.failed_checks, result.failed_checks
