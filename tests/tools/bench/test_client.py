from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tools.bench.client import Exchange, Outcome, request_body, stream_request
from tools.bench.config import BenchConfig

pytestmark = pytest.mark.anyio


def config(**fields: Any) -> BenchConfig:
    return BenchConfig(url="http://server", model="m", **fields)


def test_chat_body_replays_the_conversation() -> None:
    history = [Exchange("q1", "a1"), Exchange("q2", "a2")]
    body = request_body(config(api="chat"), history, "q3", 7)
    assert body["messages"] == [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "q3"},
    ]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 7 and "min_tokens" not in body and "ignore_eos" not in body


def test_completion_prompt_extends_the_previous_prompt_and_answer() -> None:
    first = request_body(config(), [], "q1", 5)["prompt"]
    second = request_body(config(), [Exchange("q1", " a1")], "q2", 5)["prompt"]
    assert first == "q1"
    assert second == "q1 a1\nq2" and second.startswith(first)


def test_length_extensions_only_when_asked() -> None:
    body = request_body(config(min_tokens=True, ignore_eos=True), [], "q", 9)
    assert body["min_tokens"] == 9 and body["ignore_eos"] is True


def sse_transport(status: int, body: str) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body.encode(), headers={"content-type": "text/event-stream"})

    return httpx.MockTransport(handle)


async def run(transport: httpx.MockTransport) -> Outcome:
    async with httpx.AsyncClient(transport=transport, base_url="http://server") as client:
        return await stream_request(client, "/v1/completions", {"model": "m"})


def event(payload: object) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def test_stream_counts_content_chunks_and_prefers_usage() -> None:
    body = "".join(event({"choices": [{"text": t}]}) for t in ("a", "", "b", "c"))
    with_usage = body + event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}})
    outcome = await run(sse_transport(200, with_usage + "data: [DONE]\n\n"))
    assert outcome.error is None and outcome.text == "abc"
    assert (outcome.output_tokens, outcome.prompt_tokens, len(outcome.itl_s)) == (5, 3, 2)
    no_usage = await run(sse_transport(200, body + "data: [DONE]\n\n"))
    assert no_usage.error is None and no_usage.output_tokens == 3 and no_usage.prompt_tokens is None


async def test_stream_errors_are_reported_with_their_message() -> None:
    error = {"error": {"message": "model overloaded", "type": "server_error"}}
    http = await run(sse_transport(503, json.dumps(error)))
    assert http.error == "HTTP 503: model overloaded"
    plain = await run(sse_transport(404, "Not Found"))
    assert plain.error == "HTTP 404: Not Found"
    mid = await run(
        sse_transport(200, event({"choices": [{"text": "a"}]}) + event(error) + "data: [DONE]\n\n")
    )
    assert mid.error == "model overloaded" and mid.text == "a" and mid.ttft_s is not None
    cut = await run(sse_transport(200, event({"choices": [{"text": "a"}]})))
    assert cut.error == "stream ended before [DONE]"


async def test_transport_failures_become_errors() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    outcome = await run(httpx.MockTransport(refuse))
    assert outcome.error == "ConnectError: connection refused"
    assert outcome.e2e_s is not None and outcome.ttft_s is None
