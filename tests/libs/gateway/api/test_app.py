"""The HTTP shell's wiring, in process (no sockets): routes, error handlers, streaming and
the request counter over a scripted pipeline and a fake tokenizer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from cleave.worker.v1 import worker_pb2
from libs.gateway.api.app import create_app
from libs.gateway.api.http.edge import HttpEdge
from libs.gateway.api.request_limits import RequestLimits
from libs.gateway.common import errors
from libs.gateway.common.generation import Finished, GenerationSpec, SequenceEvent
from libs.gateway.fleet.pool import Endpoint
from tests.libs.gateway.fakes import FakeTokenizer, ScriptedServing, api_context

pytestmark = pytest.mark.anyio

EVENTS: list[SequenceEvent | Finished] = [
    SequenceEvent(0, "Hello", [1]),
    SequenceEvent(0, " world", [3], finish_reason="stop"),
    Finished(prompt_tokens=2, completion_tokens=2, cached_prompt_tokens=0),
]


class Workers:
    def __init__(self, *roles: str, healthy: bool = True) -> None:
        self.endpoints = [
            Endpoint(f"127.0.0.1:{7000 + i}", role, None, None, healthy, worker_pb2.WorkerStats())  # type: ignore[arg-type]
            for i, role in enumerate(roles)
        ]


def app_for(
    pipeline: Any,
    *,
    edge: HttpEdge | None = None,
    tokenizer: FakeTokenizer | None = None,
    workers: Workers | None = None,
    max_logprobs: int | None = None,
) -> Any:
    context = api_context(
        pipeline, workers=workers or Workers(), tokenizer=tokenizer, max_logprobs=max_logprobs, vocab_size=100
    )
    return create_app(context, edge)


def client(pipeline: Any, **options: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app_for(pipeline, **options)), base_url="http://gateway"
    )


def requests_counted(endpoint: str, status: str) -> float:
    labels = {"endpoint": endpoint, "status": status}
    return REGISTRY.get_sample_value("cleave_gateway_requests_total", labels) or 0.0


async def test_chat_completion_runs_the_rendered_prompt_and_answers_in_openai_format() -> None:
    pipeline = ScriptedServing(EVENTS)
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
            "stop_reason": None,
            "token_ids": None,
        }
    ]
    assert reply["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    (spec,) = pipeline.specs
    # The response names the client's id (a random one here); the work runs under it plus a suffix.
    assert spec.request_id.startswith(reply["id"].removeprefix("chatcmpl-") + "-")
    assert (spec.prompt_token_ids, spec.sampling.max_tokens, spec.stops) == ([3], 4, ["!"])
    assert requests_counted("/v1/chat/completions", "200") - before == 1


async def test_streamed_completion_ends_with_usage_and_done() -> None:
    async with client(ScriptedServing(EVENTS)) as http:
        body = {"model": "m", "prompt": [1, 2], "stream": True, "stream_options": {"include_usage": True}}
        response = await http.post("/v1/completions", json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line[len("data: ") :] for line in response.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["text"] for c in chunks[:2]] == ["Hello", " world"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 4


async def test_a_streamed_request_with_a_token_outside_the_vocabulary_is_a_400_not_a_stream() -> None:
    pipeline = ScriptedServing(EVENTS, vocab_size=100)
    async with client(pipeline) as http:
        body = {"model": "m", "prompt": [1, 100], "stream": True}
        response = await http.post("/v1/completions", json=body)
    assert response.status_code == 400
    assert response.headers["content-type"].startswith("application/json")
    assert "100" in response.json()["error"]["message"] and pipeline.specs == []


async def test_logprobs_past_the_workers_max_logprobs_are_a_400_before_any_worker_is_called() -> None:
    pipeline = ScriptedServing(EVENTS)
    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": True}
    async with client(pipeline) as http:  # workers that do not say: vLLM's default, 20
        sampled = await http.post("/v1/completions", json={"model": "m", "prompt": "x", "logprobs": 21})
        streamed = await http.post("/v1/chat/completions", json={**chat, "top_logprobs": 21, "stream": True})
        batch = await http.post(
            "/v1/chat/completions/batch", json={**chat, "messages": [chat["messages"]], "top_logprobs": 2**31}
        )
        echoed = await http.post("/v1/completions", json={"model": "m", "prompt": "x", "prompt_logprobs": -1})
    for response in (sampled, streamed, batch, echoed):
        assert response.status_code == 400 and response.json()["error"]["type"] == "BadRequestError"
    assert sampled.json()["error"]["message"].startswith(
        "Requested sample logprobs of 21, which is greater than max allowed: 20"
    )
    assert streamed.json()["error"]["param"] == "logprobs"
    # -1 is the whole vocabulary (the workers' 100 tokens).
    assert echoed.json()["error"]["message"].startswith("Requested prompt logprobs of 100, which")
    assert pipeline.specs == []
    async with client(pipeline, max_logprobs=-1) as http:
        whole = await http.post(
            "/v1/completions", json={"model": "m", "prompt": [1, 2], "logprobs": -1, "max_tokens": 2}
        )
    assert whole.status_code == 200, whole.text
    assert pipeline.specs[-1].sampling.logprobs == 100


async def test_errors_are_openai_error_objects_with_their_status() -> None:
    before = requests_counted("/v1/completions", "404")
    async with client(ScriptedServing(EVENTS)) as http:
        wrong_model = await http.post("/v1/completions", json={"model": "other", "prompt": "x"})
        invalid = await http.post("/v1/completions", json={"model": "m", "prompt": "x", "n": 0})
        too_long = await http.post("/v1/completions", json={"model": "m", "prompt": [1, 2], "max_tokens": 31})
    assert wrong_model.status_code == 404
    assert wrong_model.json()["error"]["code"] == "model_not_found"
    assert invalid.status_code == 400
    assert invalid.json()["error"]["param"] == "body.n"  # as vLLM names it
    assert too_long.status_code == 400
    assert too_long.json()["error"]["code"] == "context_length_exceeded"
    assert requests_counted("/v1/completions", "404") - before == 1


async def test_health_models_and_tokenize() -> None:
    async with client(ScriptedServing([])) as http:
        health = await http.get("/health")
        models = await http.get("/v1/models")
        tokens = await http.post("/tokenize", json={"prompt": "Hello|!"})
    # Liveness: the gateway answers, and says what is missing.
    assert (health.status_code, health.json()["status"]) == (200, "degraded")
    assert health.json()["tokenizer"] == {"reachable": True}
    assert models.json()["data"][0]["id"] == "m"
    assert tokens.json() == {"tokens": [1, 4], "count": 2, "max_model_len": 32}


class HangingTokenizer(FakeTokenizer):
    """A tokenizer service too busy to answer: any call on it never returns."""

    async def GetInfo(self, request: Any, **_call_options: object) -> Any:
        await asyncio.Event().wait()


async def test_liveness_and_readiness_call_no_other_service() -> None:
    # /health is the liveness probe: a tokenizer that does not answer under load must not
    # make the gateway look dead (its health watch says how the tokenizer is).
    async with client(ScriptedServing([]), workers=Workers("both"), tokenizer=HangingTokenizer()) as http:
        async with asyncio.timeout(2):
            health = await http.get("/health")
            ready = await http.get("/ready")
    assert health.status_code == 200 and health.json()["tokenizer"] == {"reachable": True}
    assert ready.status_code == 200


async def test_ready_needs_the_tokenizer_and_every_role_a_request_uses() -> None:
    async def ready(**options: Any) -> tuple[int, dict[str, Any]]:
        async with client(ScriptedServing([]), **options) as http:
            response = await http.get("/ready")
        return response.status_code, response.json()

    assert await ready(workers=Workers("prefill", "decode")) == (200, {"ready": True})
    assert await ready(workers=Workers("both")) == (200, {"ready": True})
    status, body = await ready(workers=Workers("decode"))
    assert (status, body["ready"]) == (503, False) and "prefill" in body["reason"]
    status, body = await ready(workers=Workers("prefill", "decode", healthy=False))
    assert status == 503 and "decode" in body["reason"]
    status, body = await ready(workers=Workers("both"), tokenizer=FakeTokenizer(reachable=False))
    assert status == 503 and "tokenizer" in body["reason"]
    async with client(
        ScriptedServing([]), workers=Workers("both"), tokenizer=FakeTokenizer(reachable=False)
    ) as http:
        health = (await http.get("/health")).json()
    assert health["status"] == "degraded" and health["tokenizer"] == {
        "reachable": False,
        "error": "UNAVAILABLE",
    }


async def test_request_bounds_are_400s_before_the_tokenizer_is_called() -> None:
    tokenizer = FakeTokenizer()
    edge = HttpEdge(limits=RequestLimits(max_prompt_chars=10, max_stop_strings=2, max_sequences=4))
    async with client(ScriptedServing(EVENTS), edge=edge, tokenizer=tokenizer) as http:
        long_prompt = await http.post("/v1/completions", json={"model": "m", "prompt": "a" * 11})
        long_chat = await http.post(
            "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "a" * 11}]}
        )
        stops = await http.post(
            "/v1/completions", json={"model": "m", "prompt": "a", "stop": ["1", "2", "3"]}
        )
        sequences = await http.post("/v1/completions", json={"model": "m", "prompt": ["a", "b", "c"], "n": 2})
    params = [r.json()["error"]["param"] for r in (long_prompt, long_chat, stops, sequences)]
    assert [r.status_code for r in (long_prompt, long_chat, stops, sequences)] == [400] * 4
    assert params == ["prompt", "messages", "stop", "n"]
    assert tokenizer.calls == []


async def test_the_servers_max_tokens_cap_applies_when_the_client_gives_none() -> None:
    pipeline = ScriptedServing(EVENTS)
    edge = HttpEdge(limits=RequestLimits(max_tokens_cap=5))
    async with client(pipeline, edge=edge) as http:
        body = {"model": "m", "messages": [{"role": "user", "content": "abc"}]}
        assert (await http.post("/v1/chat/completions", json=body)).status_code == 200
    assert pipeline.specs[0].sampling.max_tokens == 5


async def test_a_client_that_leaves_a_whole_response_cancels_its_generation() -> None:
    pipeline = ScriptedServing([], hang=True)
    app = app_for(pipeline)
    body = json.dumps({"model": "m", "prompt": [1, 2], "max_tokens": 4}).encode()
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await pipeline.waiting.wait()  # the generation runs: now the client goes away
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"",
        "root_path": "", "headers": [(b"content-type", b"application/json")], "server": ("gateway", 80),
        "client": ("127.0.0.1", 1),
    }  # fmt: skip
    await app(scope, receive, send)
    assert pipeline.closed.is_set()  # the pipeline's generator was closed: its gRPC calls cancelled
    assert sent[0]["status"] == 499


class OneFailsOneHangs:
    """Prompt [1] fails once prompt [2] has started; prompt [2] would run forever."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.hanging_closed = asyncio.Event()

    def check(self, spec: GenerationSpec) -> None:
        pass

    async def generate(self, spec: GenerationSpec) -> AsyncIterator[SequenceEvent | Finished]:
        if spec.prompt_token_ids == [1]:
            await self.started.wait()
            raise errors.invalid("prompt 0 is bad", "prompt")
        self.started.set()
        try:
            await asyncio.Event().wait()
        finally:
            self.hanging_closed.set()
        yield Finished(0, 0, 0)  # never reached; makes this an async generator


async def test_a_failing_prompt_of_a_list_cancels_its_siblings() -> None:
    pipeline = OneFailsOneHangs()
    async with client(pipeline) as http:
        response = await http.post(
            "/v1/completions", json={"model": "m", "prompt": [[1], [2]], "max_tokens": 2}
        )
    assert response.status_code == 400 and "prompt 0 is bad" in response.json()["error"]["message"]
    assert pipeline.hanging_closed.is_set()


async def test_a_full_queue_is_a_429_carrying_retry_after() -> None:
    async with client(ScriptedServing([], error=errors.queue_full(8, retry_after_s=1))) as http:
        response = await http.post("/v1/completions", json={"model": "m", "prompt": [1, 2], "max_tokens": 4})
    assert response.status_code == 429 and response.headers["retry-after"] == "1"
    assert response.json()["error"]["code"] == "rate_limit_exceeded"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_a_streamed_request_refused_before_its_first_token_gets_the_status_and_headers(
    path: str,
) -> None:
    body: dict[str, Any] = {"model": "m", "max_tokens": 4, "stream": True}
    body |= (
        {"prompt": [1, 2]} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "a"}]}
    )
    pipeline = ScriptedServing([], error=errors.queue_full(8, retry_after_s=1))
    async with client(pipeline) as http:
        response = await http.post(path, json=body)
    assert response.status_code == 429 and response.headers["retry-after"] == "1"
    assert response.json()["error"]["code"] == "rate_limit_exceeded"
    assert pipeline.closed.is_set()


async def test_a_failure_after_the_first_token_is_an_error_event_in_the_stream() -> None:
    pipeline = ScriptedServing(
        EVENTS[:1], error=errors.ApiError(503, "worker gone", type_="service_unavailable")
    )
    async with client(pipeline) as http:
        response = await http.post("/v1/completions", json={"model": "m", "prompt": [1, 2], "stream": True})
    assert response.status_code == 200
    events = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    assert json.loads(events[0])["choices"][0]["text"] == "Hello"
    assert json.loads(events[1])["error"]["message"] == "worker gone"
    assert events[-1] == "[DONE]" and pipeline.closed.is_set()


@pytest.mark.parametrize(
    ("method", "path", "content", "status"),
    [
        ("POST", "/v1/completions", b'{"model": "m", "prompt": "a \xff\xfe b"}', 400),
        ("POST", "/v1/completions", b"[" * 100_000 + b"]" * 100_000, 400),
        ("GET", "/v1/nowhere", b"", 404),
        ("GET", "/v1/completions", b"", 405),
    ],
)
async def test_what_the_framework_refuses_is_an_openai_error_object(
    method: str, path: str, content: bytes, status: int
) -> None:
    async with client(ScriptedServing(EVENTS)) as http:
        response = await http.request(
            method, path, content=content, headers={"content-type": "application/json"}
        )
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == status and error["message"] and set(error) == {"message", "type", "param", "code"}


async def test_version_is_the_engines_vllm_version_as_vllms_server_reports_it() -> None:
    workers = Workers("decode")
    async with client(ScriptedServing(EVENTS), workers=workers) as http:
        assert (await http.get("/version")).json() == {"version": "unknown"}  # no worker answered yet
        workers.endpoints[0].info = worker_pb2.WorkerInfo(engine_version="vllm 0.32.0 cpu")
        assert (await http.get("/version")).json() == {"version": "0.32.0"}


@pytest.mark.parametrize(
    ("body", "object_"),
    [
        (
            {"model": "m", "messages": [{"role": "user", "content": "abc"}], "max_tokens": 4},
            "chat.completion",
        ),
        ({"model": "m", "prompt": [1, 2], "max_tokens": 4}, "text_completion"),
    ],
)
async def test_invocations_route_a_body_as_vllms_sagemaker_endpoint_does(
    body: dict[str, Any], object_: str
) -> None:
    async with client(ScriptedServing(EVENTS)) as http:
        response = await http.post("/invocations", json=body)
        assert response.status_code == 200 and response.json()["object"] == object_
        assert (await http.get("/ping")).status_code == 200


async def test_invocations_refuse_a_body_no_endpoint_takes() -> None:
    async with client(ScriptedServing(EVENTS)) as http:
        response = await http.post("/invocations", json={"model": "m", "input": "abc"})
        assert response.status_code == 400 and "suitable handler" in response.json()["error"]["message"]
        broken = await http.post("/invocations", content=b"{", headers={"content-type": "application/json"})
        assert broken.status_code == 400 and "not valid JSON" in broken.json()["error"]["message"]


async def test_batched_chat_answers_each_conversation_with_its_own_request() -> None:
    pipeline = ScriptedServing(EVENTS)
    async with client(pipeline) as http:
        response = await http.post(
            "/v1/chat/completions/batch",
            json={
                "model": "m",
                "request_id": "b",
                "messages": [[{"role": "user", "content": "a"}], [{"role": "user", "content": "bb"}]],
            },
        )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"] == "chatcmpl-b"
    assert [(c["index"], c["message"]["content"]) for c in body["choices"]] == [
        (0, "Hello world"),
        (1, "Hello world"),
    ]
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}
    # One spec per conversation, each with its own prompt and vLLM's sub-request id.
    assert sorted((s.request_id[: -len("-0123abcd")], tuple(s.prompt_token_ids)) for s in pipeline.specs) == [
        ("b_0", (1,)),
        ("b_1", (2,)),
    ]


async def test_vllm_fields_refused_ignored_and_unknown() -> None:
    async with client(ScriptedServing(EVENTS)) as http:
        refused = await http.post(
            "/v1/completions", json={"model": "m", "prompt": "Hello", "prompt_embeds": "AAAA"}
        )
        accepted = await http.post(
            "/v1/completions",
            json={
                "model": "m",
                "prompt": "Hello",
                "session_id": "s",
                "some_future_field": 1,
                "request_id": "mine",
            },
        )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "prompt_embeds"
    assert accepted.status_code == 200 and accepted.json()["id"] == "cmpl-mine"
