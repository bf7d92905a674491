"""Structured output and tool calls through the HTTP shell (scripted pipeline, fake
tokenizer): the constraint reaches the pipeline's spec, tool calls come back in OpenAI's
message and delta shapes, `auto` without --enable-auto-tool-choice is vLLM's 400."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from libs.gateway.api.app import create_app
from libs.gateway.api.context import ApiOptions
from libs.gateway.common.generation import Finished, SequenceEvent
from tests.libs.gateway.fakes import ScriptedServing, api_context

pytestmark = pytest.mark.anyio

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
QUESTION = [{"role": "user", "content": "Weather in Oslo?"}]


def client(pipeline: ScriptedServing, *, auto: bool = False) -> httpx.AsyncClient:
    context = api_context(pipeline, max_model_len=64, options=ApiOptions(enable_auto_tool_choice=auto))
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(context)), base_url="http://gateway"
    )


def events(*texts: str) -> list[SequenceEvent | Finished]:
    made: list[SequenceEvent | Finished] = [
        SequenceEvent(0, text, [i + 1], finish_reason="stop" if i == len(texts) - 1 else None)
        for i, text in enumerate(texts)
    ]
    return [*made, Finished(prompt_tokens=3, completion_tokens=len(texts), cached_prompt_tokens=0)]


async def post(pipeline: ScriptedServing, **fields: Any) -> httpx.Response:
    async with client(pipeline) as http:
        return await http.post("/v1/chat/completions", json={"model": "m", "messages": QUESTION, **fields})


async def test_required_tool_calls_come_back_with_ids_and_finish_reason_tool_calls() -> None:
    pipeline = ScriptedServing(events('[{"name": "get_weather", ', '"parameters": {"city": "Oslo"}}]'))
    response = await post(pipeline, tools=TOOLS, tool_choice="required", max_tokens=30)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    assert call["id"] and call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    schema = json.loads(pipeline.specs[0].sampling.structured_output.json_schema)
    assert schema["type"] == "array" and schema["items"]["anyOf"][0]["properties"]["name"]["enum"] == [
        "get_weather"
    ]


async def test_a_json_schema_response_format_constrains_the_generation() -> None:
    pipeline = ScriptedServing(events('{"a": 1}'))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    response = await post(pipeline, response_format=fmt, max_tokens=10)
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == '{"a": 1}'
    assert json.loads(pipeline.specs[0].sampling.structured_output.json_schema) == schema


async def test_a_named_tool_streams_tool_call_deltas() -> None:
    pipeline = ScriptedServing(events('{"city": ', '"Oslo"}'))
    named = {"type": "function", "function": {"name": "get_weather"}}
    response = await post(pipeline, tools=TOOLS, tool_choice=named, max_tokens=30, stream=True)
    chunks = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    deltas = [c["choices"][0] for c in chunks if c["choices"]]
    calls = [d["delta"]["tool_calls"][0] for d in deltas if d["delta"].get("tool_calls")]
    assert calls[0]["id"] and calls[0]["function"]["name"] == "get_weather" and "id" not in calls[1]
    assert "".join(c["function"]["arguments"] for c in calls) == '{"city": "Oslo"}'
    assert deltas[-1]["finish_reason"] == "stop"


async def test_auto_needs_the_flag_and_tool_follow_ups_are_accepted() -> None:
    refused = await post(ScriptedServing(events("x")), tools=TOOLS, max_tokens=4)
    assert refused.status_code == 400 and "--enable-auto-tool-choice" in refused.json()["error"]["message"]
    follow_up = [
        *QUESTION,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    async with client(ScriptedServing(events("Sunny."))) as http:
        body = {"model": "m", "messages": follow_up, "tools": TOOLS, "tool_choice": "none", "max_tokens": 4}
        answered = await http.post("/v1/chat/completions", json=body)
    assert answered.status_code == 200 and answered.json()["choices"][0]["message"]["content"] == "Sunny."
