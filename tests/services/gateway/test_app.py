"""The HTTP shell's wiring, in process (no sockets): routes, error handlers, streaming and
the request counter over a scripted pipeline and a fake tokenizer."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from libs.gateway.pipeline import Finished, SequenceEvent
from services.gateway.app import GatewayState, create_app
from tests.libs.gateway.fakes import FakeTokenizer, ScriptedPipeline

pytestmark = pytest.mark.anyio

EVENTS: list[SequenceEvent | Finished] = [
    SequenceEvent(0, "Hello", [1]),
    SequenceEvent(0, " world", [3], finish_reason="stop"),
    Finished(prompt_tokens=2, completion_tokens=2, cached_prompt_tokens=0),
]


class NoWorkers:
    def __init__(self) -> None:
        self.endpoints: list[Any] = []


def client(pipeline: ScriptedPipeline) -> httpx.AsyncClient:
    state = GatewayState(
        served_model="m",
        max_model_len=32,
        pipeline=pipeline,  # type: ignore[arg-type]
        pool=NoWorkers(),  # type: ignore[arg-type]
        tokenizer=FakeTokenizer(),  # type: ignore[arg-type]
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(state)), base_url="http://gateway")


def requests_counted(endpoint: str, status: str) -> float:
    labels = {"endpoint": endpoint, "status": status}
    return REGISTRY.get_sample_value("cleave_gateway_requests_total", labels) or 0.0


async def test_chat_completion_runs_the_rendered_prompt_and_answers_in_openai_format() -> None:
    pipeline = ScriptedPipeline(EVENTS)
    before = requests_counted("/v1/chat/completions", "200")
    async with client(pipeline) as http:
        body = {"model": "m", "messages": [{"role": "user", "content": "abc"}], "max_tokens": 4, "stop": "!"}
        response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    reply = response.json()
    assert reply["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello world"},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert reply["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    (spec,) = pipeline.specs
    assert reply["id"] == f"chatcmpl-{spec.request_id}"
    assert (spec.prompt_token_ids, spec.sampling.max_tokens, spec.stops) == ([3], 4, ["!"])
    assert requests_counted("/v1/chat/completions", "200") - before == 1


async def test_streamed_completion_ends_with_usage_and_done() -> None:
    async with client(ScriptedPipeline(EVENTS)) as http:
        body = {"model": "m", "prompt": [1, 2], "stream": True, "stream_options": {"include_usage": True}}
        response = await http.post("/v1/completions", json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line[len("data: ") :] for line in response.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["text"] for c in chunks[:2]] == ["Hello", " world"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 4


async def test_a_streamed_request_with_a_token_outside_the_vocabulary_is_a_400_not_a_stream() -> None:
    pipeline = ScriptedPipeline(EVENTS, vocab_size=100)
    async with client(pipeline) as http:
        body = {"model": "m", "prompt": [1, 100], "stream": True}
        response = await http.post("/v1/completions", json=body)
    assert response.status_code == 400
    assert response.headers["content-type"].startswith("application/json")
    assert "100" in response.json()["error"]["message"] and pipeline.specs == []


async def test_errors_are_openai_error_objects_with_their_status() -> None:
    before = requests_counted("/v1/completions", "404")
    async with client(ScriptedPipeline(EVENTS)) as http:
        wrong_model = await http.post("/v1/completions", json={"model": "other", "prompt": "x"})
        invalid = await http.post("/v1/completions", json={"model": "m", "prompt": "x", "n": 0})
        too_long = await http.post("/v1/completions", json={"model": "m", "prompt": [1, 2], "max_tokens": 31})
    assert wrong_model.status_code == 404
    assert wrong_model.json()["error"]["code"] == "model_not_found"
    assert invalid.status_code == 400
    assert invalid.json()["error"]["param"] == "n"
    assert too_long.status_code == 400
    assert too_long.json()["error"]["code"] == "context_length_exceeded"
    assert requests_counted("/v1/completions", "404") - before == 1


async def test_health_models_and_tokenize() -> None:
    async with client(ScriptedPipeline([])) as http:
        health = await http.get("/health")
        models = await http.get("/v1/models")
        tokens = await http.post("/tokenize", json={"prompt": "Hello|!"})
    assert (health.status_code, health.json()) == (503, {"status": "unavailable", "workers": []})
    assert models.json()["data"][0]["id"] == "m"
    assert tokens.json() == {"tokens": [1, 4], "count": 2, "max_model_len": 32}
