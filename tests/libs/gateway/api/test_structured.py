"""response_format, vLLM's structured_outputs and forced tool choices -> the contract's
StructuredOutput, with vLLM's request checks and messages."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from cleave.common.v1 import common_pb2
from libs.gateway.api.openai_api import ChatCompletionRequest, CompletionRequest
from libs.gateway.api.requests import sampling_params
from libs.gateway.common import errors

MESSAGES = [{"role": "user", "content": "hi"}]
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "time"}}


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES, **fields})


def constraint(body: Any) -> common_pb2.StructuredOutput:
    return sampling_params(body, max_tokens=8, logprobs=None).structured_output


def test_no_constraint_by_default_and_for_text() -> None:
    assert constraint(chat()).WhichOneof("kind") is None
    assert constraint(chat(response_format={"type": "text"})).WhichOneof("kind") is None


def test_json_schema_and_json_object_formats() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    spec = constraint(
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    )
    assert json.loads(spec.json_schema) == schema
    assert constraint(chat(response_format={"type": "json_object"})).json_object is True


def test_completions_take_response_format_and_structured_outputs_too() -> None:
    body = CompletionRequest.model_validate(
        {"model": "m", "prompt": "p", "structured_outputs": {"regex": "[ab]+"}}
    )
    assert constraint(body).regex == "[ab]+"


def test_a_json_schema_format_needs_its_schema() -> None:
    with pytest.raises(ValidationError, match="'json_schema' field must be provided"):
        chat(response_format={"type": "json_schema"})


@pytest.mark.parametrize(
    ("structured", "kind", "value"),
    [
        ({"choice": ["yes", "no"]}, "choice", ["yes", "no"]),
        ({"regex": "\\d+"}, "regex", "\\d+"),
        ({"json": {"type": "integer"}}, "json_schema", '{"type": "integer"}'),
        ({"json": '{"type": "integer"}'}, "json_schema", '{"type": "integer"}'),
        ({"grammar": 'root ::= "a"'}, "grammar", 'root ::= "a"'),
        ({"json_object": True}, "json_object", True),
    ],
)
def test_structured_outputs_kinds(structured: dict[str, Any], kind: str, value: Any) -> None:
    spec = constraint(chat(structured_outputs=structured))
    assert spec.WhichOneof("kind") == kind
    got = list(spec.choice.choices) if kind == "choice" else getattr(spec, kind)
    assert got == value


def test_response_format_overrides_the_kind_and_keeps_the_options() -> None:
    spec = constraint(
        chat(
            structured_outputs={"regex": "a", "disable_any_whitespace": True},
            response_format={"type": "json_object"},
        )
    )
    assert spec.WhichOneof("kind") == "json_object" and spec.disable_any_whitespace


def test_one_kind_of_constraint() -> None:
    with pytest.raises(ValidationError, match="only use one kind of constraints"):
        chat(structured_outputs={"regex": "a", "choice": ["a"]})


def test_a_named_tool_choice_excludes_structured_outputs() -> None:
    named = {"type": "function", "function": {"name": "weather"}}
    with pytest.raises(ValidationError, match="either use constraints for structured outputs or tools"):
        chat(tools=[WEATHER], tool_choice=named, structured_outputs={"regex": "a"})


def test_a_named_tool_is_constrained_by_its_parameters() -> None:
    spec = constraint(
        chat(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "weather"}})
    )
    assert json.loads(spec.json_schema) == WEATHER["function"]["parameters"]
    no_params = constraint(
        chat(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "time"}})
    )
    assert json.loads(no_params.json_schema) == {"type": "object", "properties": {}}


def test_required_is_an_array_of_calls_to_any_tool_as_vllm_builds_it() -> None:
    spec = constraint(
        chat(tools=[WEATHER, TIME], tool_choice="required", response_format={"type": "json_object"})
    )
    schema = json.loads(spec.json_schema)  # the tools' schema replaces response_format
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    names = [alt["properties"]["name"]["enum"] for alt in schema["items"]["anyOf"]]
    assert names == [["weather"], ["time"]]
    assert schema["items"]["anyOf"][0]["properties"]["parameters"] == WEATHER["function"]["parameters"]
    single = json.loads(
        constraint(chat(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)).json_schema
    )
    assert single["maxItems"] == 1


def test_required_merges_the_tools_defs() -> None:
    shared = {"type": "string"}
    tool = {
        "type": "function",
        "function": {"name": "a", "parameters": {"$defs": {"S": shared}, "type": "object"}},
    }
    schema = json.loads(constraint(chat(tools=[tool], tool_choice="required")).json_schema)
    assert schema["$defs"] == {"S": shared}
    assert "$defs" not in schema["items"]["anyOf"][0]["properties"]["parameters"]
    other = {
        "type": "function",
        "function": {"name": "b", "parameters": {"$defs": {"S": {"type": "integer"}}}},
    }
    with pytest.raises(errors.ApiError, match="multiple schemas"):
        constraint(chat(tools=[tool, other], tool_choice="required"))


def test_auto_and_none_add_no_constraint() -> None:
    assert constraint(chat(tools=[WEATHER])).WhichOneof("kind") is None
    assert constraint(chat(tools=[WEATHER], tool_choice="none")).WhichOneof("kind") is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tools": []}, "`tools` must not be an empty array"),
        ({"tool_choice": "required"}, "When using `tool_choice`, `tools` must be set."),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "does not match any",
        ),
    ],
)
def test_vllms_tool_checks(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        chat(**fields)


def test_tool_choice_defaults_to_auto_with_tools_else_none() -> None:
    assert chat(tools=[WEATHER]).tool_choice == "auto"
    assert chat().tool_choice == "none"
