"""Request ids as vLLM's server keeps them (libs/gateway/api/request_ids.py): the client's
`request_id` names the response only; the request's work runs under it plus a random suffix,
so two requests carrying the same id both succeed; a too-long id is a 400 naming the field.
And the batched chat endpoint held to the request's bounds before any work."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from libs.gateway.api.app import create_app
from libs.gateway.api.http.auth import ApiKeys
from libs.gateway.api.http.edge import HttpEdge
from libs.gateway.api.request_ids import MAX_REQUEST_ID_CHARS
from libs.gateway.api.request_limits import DEFAULT_MAX_SEQUENCES, RequestLimits
from libs.gateway.common import errors
from libs.gateway.common.generation import Finished, GenerationSpec, SequenceEvent
from tests.libs.gateway.fakes import FakeTokenizer, ScriptedServing, TableModel, api_context

pytestmark = pytest.mark.anyio

EVENTS: list[SequenceEvent | Finished] = [
    SequenceEvent(0, "Hello", [1], finish_reason="stop"),
    Finished(prompt_tokens=1, completion_tokens=1, cached_prompt_tokens=0),
]
SUFFIX = re.compile(r"-[0-9a-f]{8}$")
CHAT = {"model": "m", "messages": [{"role": "user", "content": "abc"}], "max_tokens": 2}


class UniqueIdWorker:
    """Serving.generate's shape with a worker's rule: a request id already running is refused
    (the worker's shared call answers "request id ... is already running"). Each request
    waits until `concurrent` have started, so they overlap for certain."""

    def __init__(self, concurrent: int) -> None:
        self.running: set[str] = set()
        self.specs: list[GenerationSpec] = []
        self._started = 0
        self._all_started = asyncio.Event()
        self._concurrent = concurrent

    def check(self, spec: GenerationSpec) -> None:
        pass

    async def generate(self, spec: GenerationSpec) -> AsyncIterator[SequenceEvent | Finished]:
        if spec.request_id in self.running:
            raise errors.invalid(f"request id {spec.request_id!r} is already running")
        self.running.add(spec.request_id)
        self.specs.append(spec)
        self._started += 1
        if self._started >= self._concurrent:
            self._all_started.set()
        try:
            with contextlib.suppress(TimeoutError):  # one refused: the other goes on alone
                await asyncio.wait_for(self._all_started.wait(), 2)
            for event in EVENTS:
                yield event
        finally:
            self.running.discard(spec.request_id)


def client(
    serving: Any, edge: HttpEdge | None = None, tokenizer: FakeTokenizer | None = None
) -> httpx.AsyncClient:
    context = api_context(serving, workers=object(), tokenizer=tokenizer, vocab_size=100)
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(context, edge)), base_url="http://gateway"
    )


def internal_of(spec: GenerationSpec, client_id: str) -> bool:
    return spec.request_id.startswith(f"{client_id}-") and bool(SUFFIX.search(spec.request_id))


@pytest.mark.parametrize(
    ("path", "body", "prefix"),
    [
        ("/v1/chat/completions", CHAT, "chatcmpl"),
        ("/v1/chat/completions", {**CHAT, "stream": True}, "chatcmpl"),
        ("/v1/completions", {"model": "m", "prompt": [1, 2], "max_tokens": 2}, "cmpl"),
        ("/v1/completions", {"model": "m", "prompt": [1, 2], "max_tokens": 2, "stream": True}, "cmpl"),
    ],
)
async def test_two_concurrent_requests_with_one_request_id_are_both_served(
    path: str, body: dict[str, Any], prefix: str
) -> None:
    worker = UniqueIdWorker(concurrent=2)
    async with client(worker) as http:
        answers = await asyncio.gather(
            *(http.post(path, json={**body, "request_id": "same"}) for _ in range(2))
        )
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    for answer in answers:
        if body.get("stream"):
            chunks = [
                json.loads(line[6:]) for line in answer.text.split("\n\n") if line.startswith("data: {")
            ]
            assert {chunk["id"] for chunk in chunks} == {f"{prefix}-same"}
        else:
            assert answer.json()["id"] == f"{prefix}-same"
    first, second = worker.specs
    assert internal_of(first, "same") and internal_of(second, "same")
    assert first.request_id != second.request_id
    assert first.metadata().request_id == first.request_id  # what every worker call carries


async def test_without_a_request_id_the_response_names_a_random_one_the_work_runs_under() -> None:
    serving = ScriptedServing(EVENTS)
    async with client(serving) as http:
        chat = (await http.post("/v1/chat/completions", json=CHAT)).json()
    client_id = chat["id"].removeprefix("chatcmpl-")
    assert re.fullmatch(r"[0-9a-f]{16}", client_id)  # vLLM's random_uuid
    (spec,) = serving.specs
    assert internal_of(spec, client_id)


async def test_each_prompt_of_a_list_runs_under_id_dash_index_plus_a_suffix() -> None:
    serving = ScriptedServing(EVENTS)
    body = {"model": "m", "prompt": [[1], [2]], "max_tokens": 2, "request_id": "x"}
    async with client(serving) as http:
        whole = await http.post("/v1/completions", json=body)
        streamed = await http.post("/v1/completions", json={**body, "stream": True})
    assert whole.json()["id"] == "cmpl-x"
    assert '"id": "cmpl-x"' in streamed.text and "cmpl-x-" not in streamed.text
    ids = sorted(spec.request_id for spec in serving.specs)
    assert [SUFFIX.sub("", i) for i in ids] == ["x-0", "x-0", "x-1", "x-1"]
    assert len(set(ids)) == 4  # each run its own


async def test_a_batch_runs_each_conversation_under_its_sub_id_plus_a_suffix() -> None:
    serving = ScriptedServing(EVENTS)
    conversations = [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]
    async with client(serving) as http:
        answer = await http.post(
            "/v1/chat/completions/batch", json={"model": "m", "request_id": "b", "messages": conversations}
        )
    assert answer.status_code == 200, answer.text
    assert answer.json()["id"] == "chatcmpl-b"
    assert sorted(SUFFIX.sub("", spec.request_id) for spec in serving.specs) == ["b_0", "b_1"]
    assert all(SUFFIX.search(spec.request_id) for spec in serving.specs)


async def test_beam_search_steps_run_under_the_internal_id() -> None:
    model = TableModel({1: {2: 0.6, 4: 0.4}, 2: {4: 0.9, 3: 0.1}, 3: {4: 1.0}})
    body = {
        "model": "m",
        "prompt": [1],
        "n": 2,
        "max_tokens": 2,
        "use_beam_search": True,
        "request_id": "beam",
    }
    async with client(model, tokenizer=FakeTokenizer(eos_token_ids=[4])) as http:
        answer = await http.post("/v1/completions", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["id"] == "cmpl-beam"
    assert all(re.fullmatch(r"beam-[0-9a-f]{8}-beam-\d+-\d+", spec.request_id) for spec in model.specs)


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/v1/completions", "/v1/chat/completions/batch", "/invocations"]
)
async def test_a_request_id_past_the_bound_is_a_400_naming_the_field(path: str) -> None:
    serving = ScriptedServing(EVENTS)
    tokenizer = FakeTokenizer()
    body: dict[str, Any] = (
        {"model": "m", "prompt": [1, 2], "max_tokens": 2} if path == "/v1/completions" else dict(CHAT)
    )
    if path.endswith("/batch"):
        body["messages"] = [body["messages"]]
    async with client(serving, tokenizer=tokenizer) as http:
        at_bound = await http.post(path, json={**body, "request_id": "r" * MAX_REQUEST_ID_CHARS})
        past = await http.post(path, json={**body, "request_id": "r" * (MAX_REQUEST_ID_CHARS + 1)})
        huge = await http.post(path, json={**body, "request_id": "r" * 2**20})
    assert at_bound.status_code == 200, at_bound.text
    for answer in (past, huge):
        assert answer.status_code == 400, answer.text[:300]
        assert answer.json()["error"]["param"] in ("request_id", "body.request_id")
        assert str(MAX_REQUEST_ID_CHARS) in answer.json()["error"]["message"]
    assert len(serving.specs) == 1  # only the request within the bound reached the serving room


async def test_a_batch_of_4000_conversations_is_a_400_at_once_before_any_work() -> None:
    serving = ScriptedServing(EVENTS)
    tokenizer = FakeTokenizer()
    body = {"model": "m", "max_tokens": 2, "messages": [[{"role": "user", "content": "hi"}]] * 4000}
    async with client(serving, tokenizer=tokenizer) as http:
        started = time.perf_counter()
        answer = await http.post("/v1/chat/completions/batch", json=body)
        elapsed = time.perf_counter() - started
    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    assert error["param"] == "messages"
    assert (
        "4000 conversation(s)" in error["message"] and f"at most {DEFAULT_MAX_SEQUENCES}" in error["message"]
    )
    assert tokenizer.calls == [] and serving.specs == []
    assert elapsed < 1.0, elapsed
    print(f"4,000 conversations: 400 in {elapsed * 1000:.0f} ms")


async def test_a_batch_is_held_to_the_sequence_and_prompt_character_bounds() -> None:
    serving = ScriptedServing(EVENTS)
    tokenizer = FakeTokenizer()
    edge = HttpEdge(limits=RequestLimits(max_sequences=3, max_prompt_chars=10))
    one = [{"role": "user", "content": "abcd"}]
    async with client(serving, edge, tokenizer) as http:
        three = await http.post("/v1/chat/completions/batch", json={"model": "m", "messages": [one] * 2})
        four = await http.post("/v1/chat/completions/batch", json={"model": "m", "messages": [one] * 4})
        # Each conversation is within the character bound; together (12 characters) they are not.
        chars = await http.post("/v1/chat/completions/batch", json={"model": "m", "messages": [one] * 3})
    assert three.status_code == 200, three.text
    assert (four.status_code, four.json()["error"]["param"]) == (400, "messages")
    assert "at most 3 per request" in four.json()["error"]["message"]
    assert (chars.status_code, chars.json()["error"]["param"]) == (400, "messages")
    assert "12 characters" in chars.json()["error"]["message"]
    assert len(serving.specs) == 2  # the first batch's only


async def test_cache_salt_per_api_key_gives_each_key_its_own_salt_before_the_clients() -> None:
    serving = ScriptedServing(EVENTS)
    edge = HttpEdge(api_keys=ApiKeys(["sk-alice", "sk-bob"]), cache_salt_key=b"s" * 32)
    alice, bob = ({"Authorization": f"Bearer sk-{name}"} for name in ("alice", "bob"))
    batch = {"model": "m", "messages": [CHAT["messages"]] * 2}
    async with client(serving, edge) as http:
        for headers in (alice, alice, bob):
            assert (await http.post("/v1/chat/completions", json=CHAT, headers=headers)).status_code == 200
        streamed = {"model": "m", "prompt": [1], "stream": True, "cache_salt": "mine"}
        assert (await http.post("/v1/completions", json=streamed, headers=alice)).status_code == 200
        assert (await http.post("/v1/chat/completions/batch", json=batch, headers=bob)).status_code == 200
    salts = [spec.cache_salt for spec in serving.specs]
    assert salts[0] == salts[1] != salts[2]  # one salt per key, stable
    assert all(re.fullmatch(r"key-[0-9a-f]{32}", salt) for salt in salts[:3])
    assert salts[3] == f"{salts[0]}|mine"  # the client's own salt partitions within its tenant
    assert salts[4:] == [salts[2], salts[2]]  # each conversation of a batch
    assert not any("alice" in salt or "bob" in salt for salt in salts)
    # Another secret, other salts: the salt tells nothing about the key without it.
    other = HttpEdge(api_keys=ApiKeys(["sk-alice"]), cache_salt_key=b"t" * 32)
    assert other.tenant_salt([(b"authorization", b"Bearer sk-alice")]) != salts[0]


async def test_without_cache_salt_per_api_key_the_clients_salt_is_used_alone() -> None:
    serving = ScriptedServing(EVENTS)
    edge = HttpEdge(api_keys=ApiKeys(["sk-alice"]))
    async with client(serving, edge) as http:
        for salt in ("mine", None):
            body = {**CHAT, "cache_salt": salt} if salt else CHAT
            answer = await http.post(
                "/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-alice"}
            )
            assert answer.status_code == 200
    assert [spec.cache_salt for spec in serving.specs] == ["mine", ""]
