"""Fuzzing the gateway's HTTP API on a real pd stack (SmolLM2; tests/e2e/conftest.py:
edge_stack, which test_lifecycle ends afterwards) from its own OpenAPI document
(`/openapi.json`, FastAPI's), with schemathesis: for every operation, bodies that follow the
schema (positive) and bodies that break it (negative: wrong types, values out of range,
required fields missing, not an object, raw bytes), plus hand-made malformed bytes
schemathesis does not produce (invalid UTF-8, truncated JSON, 100,000-deep arrays,
NaN/Infinity literals, lone surrogates, megabyte prompts). For every one: never a 5xx, a 4xx
is always an OpenAI error object, no request hangs. Afterwards a valid request succeeds, every
worker is healthy and idle (none was ejected). max_tokens is kept at 4 or less so that the
examples that reach the model stay cheap; the examples are fixed (derandomized) so that CI
runs the same ones. Then the edge's bounds on the real workers (two requests with one
request_id, a 4,000-conversation batch, a 1 MiB request_id) and a short soak."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from tests.e2e.conftest import EDGE_MAX_MODEL_LEN
from tests.e2e.harness import Service
from tests.fuzz.events import outcome
from tools.soak.memory import TreeSampler
from tools.soak.report import as_json, as_text
from tools.soak.runner import SoakOptions, soak
from tools.soak.workload import Mix

MAX_MODEL_LEN = EDGE_MAX_MODEL_LEN
MAX_TOKENS = 4
TIMEOUT_S = 60.0  # per request, all bytes included: more is a hang
# Every POST operation with a body; the GET operations and /ping are fuzzed in one test.
PATHS = [
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/chat/completions/batch",
    "/invocations",
    "/tokenize",
    "/detokenize",
]
GENERATING = PATHS[:4]
MALFORMED_PATHS = PATHS[:2]
# Examples per operation and mode (the CI budget: a few minutes on 2 cores with the stack's
# start): 20 + 20 for each body, 10 + 10 for the batch (its nested conversations are slow to
# generate), 12 for the operations without a body: 232 requests.
EXAMPLES = {GenerationMode.POSITIVE: 20, GenerationMode.NEGATIVE: 20}
FEWER_EXAMPLES = {"/v1/chat/completions/batch": 10}

FUZZ = settings(
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)


class Gateway:
    def __init__(self, service: Service, base_url: str) -> None:
        self.service = service
        self.base_url = base_url
        self.client = httpx.Client(timeout=httpx.Timeout(TIMEOUT_S))
        self.session = requests.Session()  # schemathesis' transport
        self.model = self.client.get(f"{base_url}/v1/models").json()["data"][0]["id"]
        self.schema = schemathesis.openapi.from_dict(self.client.get(f"{base_url}/openapi.json").json())
        self.statuses: Counter[str] = Counter()  # "path status" -> requests, printed at the end
        self.examples = 0
        self.started = time.monotonic()


@pytest.fixture(scope="module")
def gateway(edge_stack: tuple[Service, str]) -> Iterator[Gateway]:
    # The users' default dtype (bf16 on CPU), for the README's example; the fuzzing does not care.
    gateway = Gateway(*edge_stack)
    yield gateway
    gateway.client.close()
    gateway.session.close()


def readme_first_example() -> dict[str, Any]:
    """The body of the README's first example (the first `curl ... -d '{...}'` under "Examples")."""
    readme = Path("README.md").read_text()
    examples = readme[readme.index("## Examples") :]
    found = re.search(r"-d '(\{.*?\})'", examples, re.S)
    assert found, "no curl example under the README's Examples"
    return dict(json.loads(found.group(1)))


def test_the_readmes_first_example_answers_right(gateway: Gateway) -> None:
    """The first thing a user runs: greedy, in the default bf16. "What is the capital of
    France?" answered "L'Étoile, la Marseillaise, ..." here on Intel with AMX (a near-tie, its
    first token 0.125 nats ahead); the example's question leads by >= 1.375 nats at every token."""
    body = readme_first_example()
    assert body["temperature"] == 0 and "capital of France" in body["messages"][0]["content"]
    reply = gateway.client.post(
        gateway.base_url + "/v1/chat/completions", json={**body, "model": gateway.model}
    )
    assert reply.status_code == 200, reply.text
    text = reply.json()["choices"][0]["message"]["content"]
    print(f"README's first example: {body['messages'][0]['content']!r} -> {text!r}")
    # The question it replaced, for the record (which way its near-tie falls depends on the CPU).
    old = {
        **body,
        "model": gateway.model,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
    }
    old_text = gateway.client.post(gateway.base_url + "/v1/chat/completions", json=old).json()["choices"][0][
        "message"
    ]["content"]
    print(f"the old example on this CPU: {old_text!r}")
    assert "Paris" in text, text


def send(gateway: Gateway, path: str, content: bytes, content_type: str | None = "application/json") -> None:
    """Posts `content`, reads the whole answer within TIMEOUT_S and checks its shape."""
    headers = {"content-type": content_type} if content_type else {}
    started = time.monotonic()
    with gateway.client.stream("POST", gateway.base_url + path, content=content, headers=headers) as response:
        body = response.read()
    check_answer(gateway, path, response.status_code, response.headers.get("content-type", ""), body,
                 time.monotonic() - started, repr(content[:300]))  # fmt: skip


def check_answer(
    gateway: Gateway, path: str, status: int, content_type: str, body: bytes, elapsed: float, shown: str
) -> None:
    """Never a 5xx, never a hang, a 4xx always an OpenAI error object, a stream well ended."""
    assert elapsed < TIMEOUT_S, f"{path} took {elapsed:.0f}s for {shown}"
    assert status < 500, f"{path} {status} {body[:500]!r} for {shown}"
    outcome(f"{path} {status}")
    gateway.statuses[f"{path} {status}"] += 1
    if status >= 400:
        check_error_object(json.loads(body), f"{path} {status} for {shown}")
    elif content_type.startswith("text/event-stream"):
        check_stream(body.decode(), f"{path} for {shown}")
    elif content_type.startswith("application/json"):
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


def tame(
    body: Any, gateway: Gateway, path: str, draw: st.DataObject, fields: tuple[set[str], set[str]]
) -> Any:
    """Keeps a generating request cheap (max_tokens <= 4), mostly names the served model, and
    half the time keeps the required fields and at most 3 of the others the schema declares
    (each may be refused on its own; schemathesis also adds undeclared ones, which the
    gateway ignores), so that examples get past validation to the tokenizer and worker."""
    if not isinstance(body, dict):
        return body
    body = dict(body)
    declared, required = fields
    if draw.draw(st.booleans(), label="a few fields only"):
        optional = sorted(k for k in body if k in declared and k not in required)
        keep = draw.draw(st.sets(st.sampled_from(optional), max_size=3)) if optional else set()
        body = {k: v for k, v in body.items() if k in required or k in keep}
    if "model" in body and draw.draw(st.integers(0, 9), label="model") < 8:
        body["model"] = gateway.model
    if path not in GENERATING:
        return body
    prompt = body.get("prompt")
    if isinstance(prompt, list) and draw.draw(st.booleans(), label="token ids in the vocabulary"):
        # Ids the schema allows but the vocabulary (49,152) does not are refused early: most
        # generated lists would never reach the model otherwise.
        body["prompt"] = [_in_vocabulary(item) for item in prompt]
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


def _in_vocabulary(item: Any) -> Any:
    if isinstance(item, int) and not isinstance(item, bool):
        return item % 1000
    if isinstance(item, list):
        return [_in_vocabulary(i) for i in item]
    return item


def declared_fields(gateway: Gateway, path: str) -> tuple[set[str], set[str]]:
    """The body's declared and required properties (of either request type where the body is
    one of two)."""
    raw = gateway.schema.raw_schema
    body = raw["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    declared: set[str] = set()
    required: set[str] = set()
    for option in [body, *body.get("anyOf", [])]:
        ref = option.get("$ref", "")
        schema = raw["components"]["schemas"][ref.rsplit("/", 1)[-1]] if ref else option
        declared |= set(schema.get("properties", {}))
        required |= set(schema.get("required", []))
    return declared, required


def call(gateway: Gateway, case: schemathesis.Case, path: str) -> None:
    """Sends a schemathesis case through its own transport and checks the answer."""
    gateway.examples += 1
    started = time.monotonic()
    response = case.call(base_url=gateway.base_url, session=gateway.session, timeout=TIMEOUT_S)
    content_type = response.headers.get("content-type", [""])
    check_answer(gateway, path, response.status_code, content_type[0] if content_type else "",
                 response.content, time.monotonic() - started, case.as_curl_command()[:400])  # fmt: skip


@pytest.mark.parametrize("mode", list(EXAMPLES), ids=lambda mode: mode.value)
@pytest.mark.parametrize("path", PATHS)
def test_schemathesis_bodies(gateway: Gateway, path: str, mode: GenerationMode) -> None:
    operation = gateway.schema[path]["POST"]
    fields = declared_fields(gateway, path)

    @settings(FUZZ, max_examples=FEWER_EXAMPLES.get(path, EXAMPLES[mode]))
    @given(case=operation.as_strategy(generation_mode=mode), data=st.data())
    def run(case: schemathesis.Case, data: st.DataObject) -> None:
        case.body = tame(case.body, gateway, path, data, fields)
        call(gateway, case, path)

    run()


def test_schemathesis_every_other_operation(gateway: Gateway) -> None:
    """The operations without a body (health, readiness, metrics, models, version, ping),
    as schemathesis calls them (positive and negative query strings and headers)."""
    fuzzed = gateway.schema.exclude(path=PATHS)
    operations = [result.ok() for result in fuzzed.get_all_operations()]
    assert {op.path for op in operations} >= {"/health", "/ready", "/v1/models", "/ping"}

    @settings(FUZZ, max_examples=12)
    @given(case=fuzzed.as_strategy(generation_mode=GenerationMode.POSITIVE))
    def run(case: schemathesis.Case) -> None:
        call(gateway, case, case.path)

    run()


DEEP = 100_000
# A body FastAPI cannot parse (bad UTF-8, JSON nested past Python's recursion limit, an
# integer of more than 4300 digits) is still an OpenAI error object (libs/gateway/api/app.py).
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
@pytest.mark.parametrize("path", MALFORMED_PATHS)
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


def test_the_edges_bounds_on_the_real_workers(gateway: Gateway) -> None:
    """Two concurrent requests with one request_id are both served (the worker used to refuse
    the second: [200, 400]); a 4,000-conversation batch is a 400 within a second (it used to
    fill the admission queue: 429 after 4.3 s); a 1 MiB request_id is a 400 naming it."""
    body = {"model": gateway.model, "prompt": "The quick brown fox", "max_tokens": 16,
            "ignore_eos": True, "request_id": "same-id"}  # fmt: skip

    async def twice() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
            return list(
                await asyncio.gather(
                    *(client.post(gateway.base_url + "/v1/completions", json=body) for _ in range(2))
                )
            )

    answers = asyncio.run(twice())
    assert [a.status_code for a in answers] == [200, 200], [a.text[:300] for a in answers]
    assert [a.json()["id"] for a in answers] == ["cmpl-same-id", "cmpl-same-id"]
    batch = {
        "model": gateway.model,
        "max_tokens": 2,
        "messages": [[{"role": "user", "content": "hi"}]] * 4000,
    }
    started = time.monotonic()
    refused = gateway.client.post(gateway.base_url + "/v1/chat/completions/batch", json=batch)
    elapsed = time.monotonic() - started
    assert (refused.status_code, refused.json()["error"]["param"]) == (400, "messages"), refused.text[:300]
    assert elapsed < 1.0, f"{elapsed:.2f} s"
    huge = gateway.client.post(gateway.base_url + "/v1/chat/completions/batch",
                               json={**batch, "messages": batch["messages"][:1], "request_id": "r" * 2**20})  # fmt: skip
    assert (huge.status_code, huge.json()["error"]["param"]) == (400, "request_id"), huge.text[:300]
    print(f"4,000 conversations: 400 in {elapsed * 1000:.0f} ms; same request_id twice: 200, 200")


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
    print(
        f"schemathesis examples: {gateway.examples}; all fuzzing took {time.monotonic() - gateway.started:.0f} s"
    )


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
