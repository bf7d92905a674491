"""A streamed /v1/completions with a list of prompts, as vLLM streams it: all prompts in one
stream, choice index = prompt x n + index, usage summed; echo or return_token_ids with several
prompts are a 400 naming the prompt."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from libs.gateway.api.app import create_app
from libs.gateway.common.generation import Finished, SequenceEvent
from tests.libs.gateway.fakes import FakeTokenizer, ScriptedServing, api_context

pytestmark = pytest.mark.anyio
EVENTS: list[SequenceEvent | Finished] = [
    SequenceEvent(0, "Hello", [1]),
    SequenceEvent(0, " world", [3], finish_reason="stop"),
    Finished(prompt_tokens=2, completion_tokens=2, cached_prompt_tokens=0),
]


def client(pipeline: ScriptedServing) -> httpx.AsyncClient:
    pool: Any = object()
    tokenizer: Any = FakeTokenizer()
    context = api_context(pipeline, workers=pool, tokenizer=tokenizer)
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(context)), base_url="http://gateway"
    )


async def test_a_streamed_prompt_list_is_one_stream_of_all_choices() -> None:
    pipeline = ScriptedServing(EVENTS)
    body = {
        "model": "m",
        "prompt": [[1, 2], [2, 1]],
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with client(pipeline) as http:
        response = await http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    events = [line[len("data: ") :] for line in response.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts: dict[int, str] = {}
    for chunk in chunks[:-1]:
        for choice in chunk["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    # The scripted pipeline answers sequence 0 of each prompt: choices 0 and 2 (prompt x n).
    assert texts == {0: "Hello world", 2: "Hello world"}
    assert chunks[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}
    assert sorted(spec.prompt_token_ids for spec in pipeline.specs) == [[1, 2], [2, 1]]


@pytest.mark.parametrize("extra", [{"echo": True}, {"return_token_ids": True}])
async def test_a_streamed_prompt_list_with_echo_or_token_ids_is_a_400(extra: dict[str, Any]) -> None:
    body = {"model": "m", "prompt": [[1], [2]], "stream": True, **extra}
    async with client(ScriptedServing(EVENTS)) as http:
        response = await http.post("/v1/completions", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"


async def test_running_usage_counts_each_choices_own_prompt() -> None:
    # vLLM's continuous usage: num_prompt_tokens[prompt_idx] and that choice's tokens so far.
    body = {
        "model": "m",
        "prompt": [[1, 2], [2, 1, 3]],
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    async with client(ScriptedServing(EVENTS)) as http:
        response = await http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    events = [line[len("data: ") :] for line in response.text.split("\n\n") if line]
    chunks = [json.loads(event) for event in events[:-1]]
    running = {
        (chunk["choices"][0]["index"], chunk["usage"]["completion_tokens"]): chunk["usage"]["prompt_tokens"]
        for chunk in chunks
        if chunk["choices"]
    }
    assert running == {(0, 1): 2, (0, 2): 2, (1, 1): 3, (1, 2): 3}
