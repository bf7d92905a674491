"""A 1p1d stack on the mock engine (the gateway's and the workers' own checks are what is
tested; no model needed): client mistakes never hurt other clients. Each kind of
invalid request gets a 4xx with an OpenAI error object; right after all of them, a valid
request succeeds and no worker was ejected (before fault attribution, one out-of-vocabulary
`logit_bias` key made the prefill worker answer INTERNAL, the gateway ejected it, and valid
requests got 503 until the next poll)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.harness import Service
from tests.e2e.stack import start_mock_stack, stop_gateway_stack

MAX_MODEL_LEN = 1024
SERVED = "<the served model>"  # replaced by the stack's served model name
UNKNOWN_MODEL = "gpt-17"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, str]]:
    service, base_url = start_mock_stack(
        "1p1d", tmp_path_factory.mktemp("cache"), "--max-model-len", str(MAX_MODEL_LEN)
    )
    try:
        yield service, base_url
    finally:
        stop_gateway_stack(service)


def post(base_url: str, path: str, body: dict[str, Any], timeout_s: float = 60) -> httpx.Response:
    if body.get("model") == SERVED:
        served = httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["id"]
        body = {**body, "model": served}
    return httpx.post(f"{base_url}{path}", json=body, timeout=timeout_s)


def completion(**fields: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/completions", {"model": SERVED, "prompt": "The quick brown fox", "max_tokens": 4, **fields}


def chat(**fields: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", {"model": SERVED, "messages": QUESTION, "max_tokens": 4, **fields}


# (what is wrong, path, body): every one must be refused, none may count against a worker.
MISTAKES = [
    ("logit_bias key outside the vocabulary", *completion(logit_bias={"99999": 10})),
    ("logit_bias key that is not a token id", *chat(logit_bias={"fox": 10})),
    ("seed beyond 64 bits", *completion(seed=2**70)),
    ("negative max_tokens", *completion(max_tokens=-1)),
    ("temperature above 2", *chat(temperature=5)),
    ("unknown model", *chat(model=UNKNOWN_MODEL)),
    ("empty messages", *chat(messages=[])),
    ("prompt token id outside the vocabulary", *completion(prompt=[5, 999_999])),
    ("negative prompt token id", *completion(prompt=[-1, 5])),
    ("context too long", *completion(prompt="fox " * 3 * MAX_MODEL_LEN)),
    ("n of zero", *chat(n=0)),
    ("stop of the wrong type", *completion(stop=5)),
    ("an empty stop string", *completion(stop=[""])),
    ("too many stop strings", *completion(stop=[f"s{i}" for i in range(100)])),
    ("a stop string too long", *completion(stop=["x" * 2000])),
    ("a prompt far longer than the context", *completion(prompt="x" * (40 * MAX_MODEL_LEN))),
    ("too many sequences", *completion(prompt=["a"] * 20, n=16)),
    ("top_p of zero", *chat(top_p=0)),
    ("top_k beyond 32 bits", *completion(top_k=2**40)),
    ("too many logprobs", *completion(logprobs=50)),
    ("vllm_xargs with a key the worker reserves", *chat(vllm_xargs={"cleave_moved_penalties": 1})),
]


@pytest.mark.parametrize(("mistake", "path", "body"), MISTAKES, ids=[m[0] for m in MISTAKES])
def test_each_client_mistake_is_a_4xx_openai_error(
    stack: tuple[Service, str], mistake: str, path: str, body: dict[str, Any]
) -> None:
    _service, base_url = stack
    response = post(base_url, path, body)
    assert 400 <= response.status_code < 500, f"{mistake}: {response.status_code} {response.text}"
    error = response.json()["error"]
    # Refused for what is wrong with it, not for naming another model.
    assert (error["code"] == "model_not_found") == (body["model"] == UNKNOWN_MODEL), error
    assert isinstance(error["message"], str) and error["message"], mistake
    assert isinstance(error["type"], str) and error["type"], mistake
    print(f"{mistake}: {response.status_code} {error['message']}")


def test_a_body_that_is_not_json_is_a_4xx_openai_error(stack: tuple[Service, str]) -> None:
    _service, base_url = stack
    response = httpx.post(
        f"{base_url}/v1/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert 400 <= response.status_code < 500
    assert response.json()["error"]["message"]


def test_a_50_mb_body_is_refused_413_before_it_is_read(stack: tuple[Service, str]) -> None:
    _service, base_url = stack
    chunk = b"x" * (1024 * 1024)

    def chunked() -> Iterator[bytes]:  # no Content-Length: refused while it streams in
        for _ in range(50):
            yield chunk

    for body in (chunk * 50, chunked()):
        started = time.monotonic()
        response = httpx.post(
            f"{base_url}/v1/completions",
            content=body,
            headers={"content-type": "application/json"},
            timeout=60,
        )
        elapsed = time.monotonic() - started
        assert response.status_code == 413, response.text
        assert response.json()["error"]["code"] == "request_too_large"
        print(f"413 after {elapsed:.2f} s")
        assert elapsed < 5  # well under a second on loopback: answered unread


def test_after_every_mistake_a_valid_request_succeeds_and_no_worker_was_ejected(
    stack: tuple[Service, str],
) -> None:
    _service, base_url = stack
    # All the mistakes again, back to back, the one that used to eject the prefill worker
    # last, then at once a valid request: the stats poller (1 s) has no time to reinstate an
    # ejected worker in between.
    for _mistake, path, body in [*MISTAKES[1:], MISTAKES[0]]:
        assert post(base_url, path, body).status_code < 500
    response = post(base_url, "/v1/chat/completions", chat(temperature=0, max_tokens=8)[1], timeout_s=120)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"]
    health = httpx.get(f"{base_url}/health", timeout=10)
    assert health.status_code == 200
    assert health.json()["status"] == "ok" and health.json()["tokenizer"] == {"reachable": True}
    ready = httpx.get(f"{base_url}/ready", timeout=10)
    # /ready also says what one engine step takes (issue 28's worker fact); readiness is its "ready".
    assert (ready.status_code, ready.json()["ready"]) == (200, True)
    workers = health.json()["workers"]
    assert {w["role"] for w in workers} == {"prefill", "decode"}
    assert all(w["healthy"] for w in workers), workers
