"""Structured output at the edge: `response_format`, vLLM's `structured_outputs` extension and a
forced `tool_choice` -> the contract's StructuredOutput, as vLLM's OpenAI server maps them
(vllm/entrypoints/generate/base/protocol.py: structured_outputs_from_response_format; the tool
parser's adjust_request for tools).

What vLLM checks in its request models is checked here (one kind of constraint, a json_schema
format with its schema, no constraint with a named tool). Whether a schema, regex or grammar
compiles is vLLM's structured-output backend's call, made by the engine when the request is
added: the worker answers INVALID_ARGUMENT with vLLM's message, which the pipeline returns as a
400 and never counts against the worker.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cleave.common.v1 import common_pb2
from libs.gateway.api.tools import forced_schema
from libs.gateway.common import errors


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    name: str
    description: str | None = None
    # OpenAI's field is `schema`, which pydantic's BaseModel reserves (as in vLLM).
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            # vLLM's message (ChatCompletionRequest.validate_response_format).
            raise ValueError(
                "When response_format type is 'json_schema', the 'json_schema' field must be provided."
            )
        return self


class StructuredOutputsIn(BaseModel):
    """vLLM's `structured_outputs` request field (its StructuredOutputsParams)."""

    json_: str | dict[str, Any] | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None

    model_config = ConfigDict(populate_by_name=True)

    def kinds(self) -> list[str]:
        names = ("json_", "regex", "choice", "grammar", "json_object", "structural_tag")
        return [name for name in names if getattr(self, name) is not None]


def check_constraints(structured: StructuredOutputsIn | None, tool_choice: Any) -> None:
    """vLLM's check_structured_outputs_count: one of json/regex/choice, and not with a named tool."""
    if structured is None:
        return
    count = sum(getattr(structured, name) is not None for name in ("json_", "regex", "choice"))
    if count > 1:
        raise ValueError(
            "You can only use one kind of constraints for structured outputs ('json', 'regex' or 'choice')."
        )
    if count > 0 and tool_choice not in (None, "none", "auto", "required"):
        raise ValueError("You can only either use constraints for structured outputs or tools, not both.")
    if len(structured.kinds()) > 1:
        # vLLM's StructuredOutputsParams refuses it when built (a 400 there too).
        raise ValueError(
            f"You can only use one kind of structured outputs constraint but multiple are specified: {structured.kinds()}"
        )


def structured_output(
    structured: StructuredOutputsIn | None,
    response_format: ResponseFormat | None,
    tool_schema: dict[str, Any] | None = None,
) -> common_pb2.StructuredOutput | None:
    """The constraint the engines apply, or None. A forced tool's schema replaces the others (as
    vLLM's adjust_request does); `response_format` overrides the kind of `structured_outputs`
    and keeps its options (structured_outputs_from_response_format)."""
    spec = common_pb2.StructuredOutput()
    if tool_schema is not None:
        spec.json_schema = json.dumps(tool_schema)
        return spec
    if structured is not None:
        _options(spec, structured)
        _kind(spec, structured)
    if response_format is not None and response_format.type != "text":
        if response_format.type == "json_object":
            spec.json_object = True
        else:
            assert response_format.json_schema is not None  # checked by ResponseFormat
            spec.json_schema = json.dumps(response_format.json_schema.json_schema)
    return spec if spec.WhichOneof("kind") is not None else None


def _kind(spec: common_pb2.StructuredOutput, structured: StructuredOutputsIn) -> None:
    if structured.json_ is not None:
        value = structured.json_
        spec.json_schema = value if isinstance(value, str) else json.dumps(value)
    elif structured.regex is not None:
        spec.regex = structured.regex
    elif structured.choice is not None:
        spec.choice.choices.extend(structured.choice)
    elif structured.grammar is not None:
        spec.grammar = structured.grammar
    elif structured.json_object is not None:
        # False too (a oneof member keeps its presence): vLLM refuses it with its own message.
        spec.json_object = structured.json_object
    elif structured.structural_tag is not None:
        spec.structural_tag = structured.structural_tag


def _options(spec: common_pb2.StructuredOutput, structured: StructuredOutputsIn) -> None:
    spec.disable_any_whitespace = structured.disable_any_whitespace
    spec.disable_additional_properties = structured.disable_additional_properties
    if structured.whitespace_pattern is not None:
        spec.whitespace_pattern = structured.whitespace_pattern


def request_constraint(body: Any) -> common_pb2.StructuredOutput | None:
    """The constraint of a validated completions or chat request (tools: chat only)."""
    try:
        schema = forced_schema(
            getattr(body, "tools", None),
            getattr(body, "tool_choice", None),
            getattr(body, "parallel_tool_calls", None),
        )
    except ValueError as error:
        raise errors.invalid(str(error), "tools") from None
    return structured_output(body.structured_outputs, body.response_format, schema)
