"""RenderChat's logic without gRPC: content parts and extra fields -> chat messages, the
refusals that are the caller's mistake (InvalidRequest) or the deployment's (no template:
FailedPrecondition), and a rendered prompt tokenized as vLLM's chat path does."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest

from cleave.tokenizer.v1 import tokenizer_pb2 as pb
from libs.rpc.errors import FailedPrecondition, InvalidRequest
from libs.tokenization.chat_request import chat_messages, json_object, render_chat
from libs.tokenization.tokenizer import Tokenizer


def text(value: str) -> pb.ContentPart:
    return pb.ContentPart(text=value)


def test_text_parts_are_joined_with_newlines_and_images_keep_their_parts() -> None:
    image = pb.ContentPart(image=b"\x89PNG")
    [plain, with_image] = chat_messages(
        [
            pb.ChatMessage(role="user", content=[text("a"), text("b")]),
            pb.ChatMessage(role="user", content=[text("look"), image]),
        ]
    )
    assert plain.content == "a\nb"
    assert with_image.content == [{"type": "text", "text": "look"}, {"type": "image"}]


def test_extra_fields_and_tool_calls_reach_the_message() -> None:
    call = pb.ToolCall(id="c1", name="weather", arguments='{"city": "Oslo"}')
    [message] = chat_messages(
        [pb.ChatMessage(role="assistant", extra_json='{"mood": "sunny"}', tool_calls=[call])]
    )
    assert message.extra["mood"] == "sunny"
    assert message.extra["tool_calls"][0]["function"] == {"name": "weather", "arguments": {"city": "Oslo"}}


@pytest.mark.parametrize(
    ("message", "needle"),
    [
        (pb.ChatMessage(role="user", content=[pb.ContentPart()]), r"messages\[0\]\.content\[0\] is empty"),
        (pb.ChatMessage(role="user", extra_json="[1]"), r"messages\[0\]: expected a JSON object"),
        (pb.ChatMessage(role="user", extra_json="{nope"), r"messages\[0\]: not valid JSON"),
        (
            pb.ChatMessage(role="assistant", tool_calls=[pb.ToolCall(id="c1", name="w", arguments="{nope")]),
            r"messages\[0\]: tool call 'c1'",
        ),
    ],
)
def test_malformed_messages_are_the_callers_mistake(message: pb.ChatMessage, needle: str) -> None:
    with pytest.raises(InvalidRequest, match=needle):
        chat_messages([message])


def test_an_empty_json_field_is_an_empty_object() -> None:
    assert json_object("", where="x") == {}
    assert json_object('{"a": 1}', where="x") == {"a": 1}


def test_a_model_without_a_template_is_the_deployments_fault() -> None:
    no_template = cast(Tokenizer, SimpleNamespace(has_chat_template=False))
    with pytest.raises(FailedPrecondition, match="model 'm' has no chat template"):
        render_chat(no_template, pb.RenderChatRequest(), model="m")


def test_continuing_and_adding_a_generation_prompt_at_once_is_refused(smollm2: Tokenizer) -> None:
    request = pb.RenderChatRequest(continue_final_message=True, add_generation_prompt=True)
    with pytest.raises(InvalidRequest, match="Cannot set both"):
        render_chat(smollm2, request, model="m")


def test_bad_tools_and_template_kwargs_are_refused(smollm2: Tokenizer) -> None:
    with pytest.raises(InvalidRequest, match="tools"):
        render_chat(smollm2, pb.RenderChatRequest(tools_json="{}"), model="m")
    with pytest.raises(InvalidRequest, match="chat_template_kwargs"):
        render_chat(smollm2, pb.RenderChatRequest(chat_template_kwargs_json="1"), model="m")


def test_the_rendered_prompt_is_tokenized_without_adding_special_tokens(smollm2: Tokenizer) -> None:
    request = pb.RenderChatRequest(
        messages=[pb.ChatMessage(role="user", content=[text("Hi")])], add_generation_prompt=True
    )
    response = render_chat(smollm2, request, model="m")
    assert response.prompt.startswith("<|im_start|>") and response.prompt.endswith("<|im_start|>assistant\n")
    assert list(response.token_ids) == smollm2.encode(response.prompt, add_special_tokens=False)
    assert response.num_images == 0
