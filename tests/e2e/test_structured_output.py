"""Structured output and forced tool calls through the real stack, on SmolLM2 (weak, but the
grammar makes every answer valid): 50 `json_schema` requests through 1p1d, each answer parsed
and validated against its schema; the same for `tool_choice: required` arguments; a choice and
a regex whose whole answer must match (in 1p1d the prefill worker samples the first token and
decode samples every token the client gets: a decode grammar that did not start at the first
generated token would cut or corrupt the answer's start); LangChain's
`with_structured_output(..., method="json_schema")` and `bind_tools(..., tool_choice=...)`; an
invalid regex is a 400 that no worker is blamed for. `CLEAVE_E2E_STRUCTURED_MODES=1p1d,pd` runs
the same checks on pd too, on fewer requests (not in CI: pd is the same gateway path without
the handoff, whose grammar start 1p1d checks; tests/libs/worker/test_vllm_structured_output.py
checks the colocated engine's grammar).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any

import httpx
import jsonschema
import pytest
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from tests.e2e.harness import Service

MAX_TOKENS = 160


@pytest.fixture(scope="module", params=os.environ.get("CLEAVE_E2E_STRUCTURED_MODES", "1p1d").split(","))
def stack(request: pytest.FixtureRequest, api_stacks: dict[str, tuple[Service, str]]) -> tuple[str, str]:
    """The shared stack of that mode (tests/e2e/conftest.py: its flags)."""
    return request.param, api_stacks[request.param][1]


def served(base_url: str) -> str:
    return str(httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["id"])


def schemas(count: int) -> list[dict[str, Any]]:
    """Varied schemas: enums, bounded integers and strings, booleans, nested objects, arrays."""
    colors = ["red", "green", "blue", "black", "white"]
    made = []
    for i in range(count):
        properties: dict[str, Any] = {
            f"field_{i}": {"type": "string", "maxLength": 12},
            "count": {"type": "integer", "minimum": 0, "maximum": 99},
        }
        if i % 2 == 0:
            properties["color"] = {"type": "string", "enum": colors[: 2 + i % 4]}
        if i % 3 == 0:
            properties["ok"] = {"type": "boolean"}
        if i % 5 == 0:
            properties["where"] = {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 10},
                    "zip": {"type": "integer", "minimum": 0, "maximum": 9999},
                },
                "required": ["city", "zip"],
                "additionalProperties": False,
            }
        if i % 7 == 0:
            properties["tags"] = {
                "type": "array",
                "items": {"type": "string", "enum": ["a", "b", "c"]},
                "maxItems": 3,
            }
        made.append(
            {
                "type": "object",
                "properties": properties,
                "required": sorted(properties),
                "additionalProperties": False,
            }
        )
    return made


async def post_all(base_url: str, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    limit = asyncio.Semaphore(10)
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:

        async def one(body: dict[str, Any]) -> dict[str, Any]:
            async with limit:
                response = await client.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            return dict(response.json())

        return await asyncio.gather(*(one(body) for body in bodies))


def test_every_json_schema_answer_parses_and_validates(stack: tuple[str, str]) -> None:
    mode, base_url = stack
    model = served(base_url)
    cases = schemas(50 if mode == "1p1d" else 5)
    bodies = [
        {
            "model": model,
            "messages": [{"role": "user", "content": f"Describe item number {i} as JSON."}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0.7,
            "seed": i,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": f"item_{i}", "schema": schema},
            },
        }
        for i, schema in enumerate(cases)
    ]
    answers = asyncio.run(post_all(base_url, bodies))
    for schema, answer in zip(cases, answers, strict=True):
        choice = answer["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)


TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 16},
                    "unit": {"type": "string", "enum": ["C", "F"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "PST"]}},
                "required": ["zone"],
                "additionalProperties": False,
            },
        },
    },
]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def test_every_required_tool_call_has_valid_arguments(stack: tuple[str, str]) -> None:
    mode, base_url = stack
    model = served(base_url)
    count = 50 if mode == "1p1d" else 5
    bodies = [
        {
            "model": model,
            "messages": [{"role": "user", "content": f"Question {i}: what is the weather or the time?"}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0.7,
            "seed": i,
            "tools": TOOLS,
            "tool_choice": "required",
            "parallel_tool_calls": False,
        }
        for i in range(count)
    ]
    for answer in asyncio.run(post_all(base_url, bodies)):
        choice = answer["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        calls = choice["message"]["tool_calls"]
        assert len(calls) == 1 and calls[0]["id"] and calls[0]["type"] == "function"
        function = calls[0]["function"]
        jsonschema.validate(json.loads(function["arguments"]), PARAMETERS[function["name"]])


def test_the_whole_answer_matches_a_choice_and_a_regex(stack: tuple[str, str]) -> None:
    _mode, base_url = stack
    model = served(base_url)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    choices = ["Paris, France", "Lyon", "Marseille"]
    pattern = r"[A-Z][a-z]{2,8}-[0-9]{3}"
    bodies = [
        {"model": model, "messages": question, "max_tokens": 20, "structured_outputs": {"choice": choices}},
        {"model": model, "messages": question, "max_tokens": 20, "structured_outputs": {"regex": pattern}},
    ]
    by_choice, by_regex = asyncio.run(post_all(base_url, bodies))
    assert by_choice["choices"][0]["message"]["content"] in choices
    assert re.fullmatch(pattern, by_regex["choices"][0]["message"]["content"])


def test_a_forced_tool_streams_its_arguments_in_openais_format(stack: tuple[str, str]) -> None:
    _mode, base_url = stack
    body = {
        "model": served(base_url),
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "max_tokens": MAX_TOKENS,
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "stream": True,
    }
    deltas: list[dict[str, Any]] = []
    finish = None
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=300) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[len("data: ") :])["choices"]:
                deltas.extend(choice["delta"].get("tool_calls") or [])
                finish = choice["finish_reason"] or finish
    assert deltas[0]["id"] and deltas[0]["function"]["name"] == "get_weather"
    arguments = "".join(d["function"].get("arguments") or "" for d in deltas)
    jsonschema.validate(json.loads(arguments), PARAMETERS["get_weather"])
    assert finish == "stop"  # a named tool finishes with stop (OpenAI's and vLLM's rule)


def stream_tool_deltas(base_url: str, body: dict[str, Any]) -> tuple[list[dict[str, Any]], str, str | None]:
    """A streamed chat completion's tool-call deltas, content and finish_reason."""
    deltas: list[dict[str, Any]] = []
    content, finish = "", None
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=300) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[len("data: ") :])["choices"]:
                deltas.extend(choice["delta"].get("tool_calls") or [])
                content += choice["delta"].get("content") or ""
                finish = choice["finish_reason"] or finish
    return deltas, content, finish


def test_required_streams_its_arguments_as_they_are_generated(stack: tuple[str, str]) -> None:
    _mode, base_url = stack
    body = {
        "model": served(base_url),
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "max_tokens": MAX_TOKENS,
        "tools": TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "stream": True,
    }
    deltas, _content, finish = stream_tool_deltas(base_url, body)
    assert deltas[0]["id"] and deltas[0]["index"] == 0 and deltas[0]["function"]["name"] in PARAMETERS
    assert all("id" not in d for d in deltas[1:])
    pieces = [d["function"].get("arguments") or "" for d in deltas]
    assert len([p for p in pieces if p]) > 1, pieces  # incremental, not one delta at the end
    jsonschema.validate(json.loads("".join(pieces)), PARAMETERS[deltas[0]["function"]["name"]])
    assert finish == "tool_calls"


# The Hermes syntax, forced by a regex: SmolLM2 (135M) does not write it on its own. What this
# proves is the path, not the model: the template renders the tools into the prompt, and the
# answer's text goes through vLLM's hermes parser (whole and streamed) to OpenAI tool calls.
HERMES_CALL = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{2,10}", "unit": "C"\}\}\n</tool_call>'


def test_auto_tool_choice_parses_a_hermes_call_with_vllms_parser(stack: tuple[str, str]) -> None:
    _mode, base_url = stack
    question = [{"role": "user", "content": "What is the weather in Oslo?"}]
    base = {"model": served(base_url), "messages": question, "max_tokens": 60, "temperature": 0}
    plain, with_tools = asyncio.run(post_all(base_url, [base, {**base, "tools": TOOLS, "max_tokens": 1}]))
    # The template rendered the tools (their JSON) into the prompt.
    assert with_tools["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 50
    body = {**base, "tools": TOOLS, "structured_outputs": {"regex": HERMES_CALL}}  # tool_choice: auto
    [answer] = asyncio.run(post_all(base_url, [body]))
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    [call] = choice["message"]["tool_calls"]
    assert call["id"] and call["type"] == "function" and call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), PARAMETERS["get_weather"])
    assert not choice["message"]["content"]
    deltas, content, finish = stream_tool_deltas(base_url, {**body, "stream": True})
    assert deltas[0]["id"] and deltas[0]["function"]["name"] == "get_weather" and not content.strip()
    arguments = "".join(d["function"].get("arguments") or "" for d in deltas)
    assert json.loads(arguments) == json.loads(call["function"]["arguments"])  # greedy: the same call
    assert finish == "tool_calls"


def test_an_invalid_regex_is_a_400_and_no_worker_is_blamed(stack: tuple[str, str]) -> None:
    _mode, base_url = stack
    body = {
        "model": served(base_url),
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "structured_outputs": {"regex": "(unclosed"},
    }
    for _ in range(4):  # more than --breaker-failures
        response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["message"]
    workers = httpx.get(f"{base_url}/health", timeout=10).json()["workers"]
    assert all(w["healthy"] for w in workers), workers


class City(BaseModel):
    name: str = Field(max_length=20)
    population_millions: int = Field(ge=0, le=50)
    is_capital: bool


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


def test_langchain_structured_output_and_a_forced_tool(stack: tuple[str, str]) -> None:
    _mode, base_url = stack
    settings = {
        "base_url": f"{base_url}/v1",
        "api_key": "unused",
        "model": served(base_url),
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    llm = ChatOpenAI.model_validate(settings)
    city = llm.with_structured_output(City, method="json_schema").invoke("Describe Paris.")
    assert isinstance(city, City)
    message = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("Weather in Oslo?")
    [call] = message.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str) and call["id"]
