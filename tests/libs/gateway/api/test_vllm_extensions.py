"""vLLM's extension parameters: request -> contract mapping, and what they add to responses
(prompt logprobs, echo with logprobs, token ids, token_id labels, stop_reason, chat echo),
and the batched chat endpoint's split and merge."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cleave.common.v1 import common_pb2
from cleave.tokenizer.v1 import tokenizer_pb2
from libs.gateway.api import batch_chat, extensions, responses
from libs.gateway.api.openai_api import ChatCompletionRequest, CompletionRequest
from libs.gateway.api.request_limits import RequestLimits
from libs.gateway.api.requests import chat_render, sampling_params
from libs.gateway.api.response_extras import chat_extras, token_id_labels
from libs.gateway.api.spec import generation_spec
from libs.gateway.common import errors
from libs.gateway.common.generation import Finished, SequenceEvent
from tests.libs.gateway.fakes import FakeTokenizer, ScriptedServing, spec, token

pytestmark = pytest.mark.anyio


def completion(**fields: Any) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": "Hello", **fields})


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "Hello"}], **fields}
    )


def texts() -> responses.TokenizerTexts:
    fake: Any = FakeTokenizer()
    return responses.TokenizerTexts(fake)


def test_sampling_extensions_reach_the_contract() -> None:
    body = completion(
        min_tokens=3,
        stop_token_ids=[4],
        allowed_token_ids=[1, 3, 4],
        skip_special_tokens=False,
        vllm_xargs={"k": [1, "a"]},
        prompt_logprobs=2,
    )
    params = sampling_params(body, max_tokens=8, logprobs=None)
    assert params.min_tokens == 3
    assert list(params.stop_token_ids) == [4]
    assert list(params.allowed_token_ids) == [1, 3, 4]
    assert params.skip_special_tokens is False
    assert json.loads(params.extra_args_json) == {"k": [1, "a"]}
    assert params.prompt_logprobs == 2


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (completion(echo=True, logprobs=3), 3),  # vLLM: echo asks for the prompt's at `logprobs`
        (completion(echo=True), None),
        (completion(logprobs=3), None),
        (chat(echo=True, logprobs=True, top_logprobs=2), 2),
        (chat(echo=True), None),
    ],
)
def test_echo_with_logprobs_asks_for_prompt_logprobs(body: Any, expected: int | None) -> None:
    params = sampling_params(body, max_tokens=8, logprobs=None)
    assert (params.prompt_logprobs if params.HasField("prompt_logprobs") else None) == expected


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"prompt_logprobs": -2}, "must be a positive value or -1"),
        ({"prompt_logprobs": 1, "stream": True}, "not available when `stream=True`"),
        ({"bad_words": [""]}, "bad_words cannot contain an empty string"),
        ({"truncate_prompt_tokens": -2}, "greater than or equal to -1"),
        ({"priority": 2**63}, "less than or equal to"),
    ],
)
def test_extension_ranges_as_vllm(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        completion(**fields)


def test_chat_option_checks_as_vllm() -> None:
    with pytest.raises(ValueError, match="Cannot set both `continue_final_message`"):
        chat(continue_final_message=True)
    with pytest.raises(ValueError, match="`logprobs` must be set to true"):
        chat(top_logprobs=2)


def test_truncate_prompt_tokens_keeps_the_last_tokens() -> None:
    made = generation_spec(
        completion(truncate_prompt_tokens=2),
        [1, 2, 3, 4],
        model="m",
        max_model_len=10,
        max_tokens=2,
        logprobs=None,
    )
    assert made.prompt_token_ids == [3, 4]
    whole = generation_spec(
        completion(truncate_prompt_tokens=-1),
        [1, 2, 3],
        model="m",
        max_model_len=10,
        max_tokens=2,
        logprobs=None,
    )
    assert whole.prompt_token_ids == [1, 2, 3]
    with pytest.raises(errors.ApiError, match="greater than max_model_len"):
        extensions.truncated([1], completion(truncate_prompt_tokens=11), 10)


def test_request_id_and_include_stop_str_reach_the_spec() -> None:
    made = generation_spec(
        completion(include_stop_str_in_output=True),
        [1],
        model="m",
        max_model_len=10,
        max_tokens=2,
        logprobs=None,
        request_id="client-id",
    )
    assert made.request_id == "client-id" and made.include_stop_str_in_output


async def test_chat_render_options_template_kwargs_and_message_fields() -> None:
    class Recording(FakeTokenizer):
        request: tokenizer_pb2.RenderChatRequest | None = None

        async def RenderChat(
            self, request: tokenizer_pb2.RenderChatRequest
        ) -> tokenizer_pb2.RenderChatResponse:
            self.request = request
            return await super().RenderChat(request)

    tokenizer: Any = Recording()
    body = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "Hi", "name": "ann"},
                {"role": "robot", "content": "Be", "mood": "calm"},
            ],
            "add_generation_prompt": False,
            "continue_final_message": True,
            "add_special_tokens": True,
            "chat_template_kwargs": {"enable_thinking": False, "add_generation_prompt": True},
            "documents": [{"title": "t", "text": "x"}],
        }
    )
    await chat_render(tokenizer, body)
    sent = tokenizer.request
    assert sent.continue_final_message and not sent.add_generation_prompt and sent.add_special_tokens
    # The request's own fields win over the same names in chat_template_kwargs (as vLLM).
    assert json.loads(sent.chat_template_kwargs_json) == {
        "enable_thinking": False,
        "documents": [{"title": "t", "text": "x"}],
    }
    assert [m.role for m in sent.messages] == ["user", "robot"]
    assert json.loads(sent.messages[0].extra_json) == {"name": "ann"}
    assert json.loads(sent.messages[1].extra_json) == {"mood": "calm"}


async def test_bad_words_tokenized_as_vllm() -> None:
    tokenizer: Any = FakeTokenizer()
    # The fake's vocabulary has "Hello" but not " Hello": only the bare form is a bad word.
    ids = await extensions.bad_words_token_ids(tokenizer, ["Hello"])
    assert [list(t.ids) for t in ids] == [[1]]
    # " world" is a token but "world" is not: vLLM requires the bare form to tokenize.
    with pytest.raises(errors.ApiError, match="at least one token"):
        await extensions.bad_words_token_ids(tokenizer, ["world"])


async def test_completion_echo_logprobs_token_ids_and_stop_reason() -> None:
    prompt_entries = [common_pb2.TokenLogprob(), token(2, -0.75, (2, -0.75), (4, -1.5))]
    pipeline = ScriptedServing(
        [
            SequenceEvent(0, " world", [3], [token(3, -0.5, (3, -0.5))]),
            SequenceEvent(0, "", [4], [token(4, -0.25, (4, -0.25))], "stop", 4),
            Finished(2, 2, 0, prompt_entries),
        ]
    )
    made = spec(prompt=(1, 2))
    generation = await responses.collect(pipeline.generate, made)
    body = await responses.text_completion(
        [made], [generation], model="m", logprobs=1, echo=True, texts=texts(), return_token_ids=True
    )
    choice = body["choices"][0]
    assert choice["text"] == "Hello, world"
    logprobs = choice["logprobs"]
    # vLLM: the prompt's tokens lead, the first without a logprob.
    assert logprobs["tokens"] == ["Hello", ",", " world", "!"]
    assert logprobs["token_logprobs"] == [None, -0.75, -0.5, -0.25]
    assert logprobs["top_logprobs"][0] is None
    # The prompt token is its position's best here: with logprobs=1 it is alone (as in vLLM).
    assert logprobs["top_logprobs"][1] == {",": -0.75}
    assert choice["stop_reason"] == 4
    assert choice["prompt_token_ids"] == [1, 2] and choice["token_ids"] == [3, 4]
    assert choice["prompt_logprobs"] == [
        None,
        {
            "2": {"logprob": -0.75, "rank": 1, "decoded_token": ","},
            "4": {"logprob": -1.5, "rank": 2, "decoded_token": "!"},
        },
    ]


async def test_tokens_as_token_ids() -> None:
    made = spec()
    generation = await responses.collect(
        ScriptedServing(
            [SequenceEvent(0, " world", [3], [token(3, -0.5, (3, -0.5))], "length"), Finished(2, 1, 0)]
        ).generate,
        made,
    )
    body = await responses.text_completion(
        [made], [generation], model="m", logprobs=0, echo=False, texts=texts(), token_text=token_id_labels
    )
    assert body["choices"][0]["logprobs"]["tokens"] == ["token_id:3"]
    assert body["choices"][0]["prompt_token_ids"] is None and body["choices"][0]["prompt_logprobs"] is None


async def test_chat_echo_role_token_ids_prompt_logprobs() -> None:
    request = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
            "add_generation_prompt": False,
            "continue_final_message": True,
            "echo": True,
            "return_token_ids": True,
            "return_prompt_text": True,
            "prompt_logprobs": 0,
        }
    )
    made = spec(prompt=(1, 2))
    events: list[SequenceEvent | Finished] = [
        SequenceEvent(0, " world", [3], [], "length"),
        Finished(2, 1, 0, [common_pb2.TokenLogprob(), token(2, -1.0)]),
    ]
    generation = await responses.collect(ScriptedServing(events).generate, made)
    body = await responses.chat_completion(
        made,
        generation,
        model="m",
        top_logprobs=None,
        token_text=texts().token_texts,
        extras=chat_extras(request, [1, 2], "<rendered>"),
    )
    message = body["choices"][0]["message"]
    # vLLM: no generation prompt, so the reply continues the last message, in its role;
    # echo puts that message's content first.
    assert message == {**message, "role": "assistant", "content": "Hello world"}
    assert body["choices"][0]["token_ids"] == [3]
    assert body["prompt_token_ids"] == [1, 2] and body["prompt_text"] == "<rendered>"
    assert body["prompt_logprobs"] == [None, {"2": {"logprob": -1.0, "rank": 1, "decoded_token": ","}}]


def test_batch_split_and_merge() -> None:
    request_id, bodies = batch_chat.split(
        {
            "model": "m",
            "request_id": "b",
            "messages": [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]],
        },
        RequestLimits(),
        32,
    )
    assert request_id == "b" and [b.request_id for b in bodies] == ["b_0", "b_1"]
    assert [b.messages[0].text() for b in bodies] == ["a", "b"]
    one = {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"content": "A"}}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
    }
    merged = batch_chat.merge("b", [one, {**one, "choices": [{"index": 0, "message": {"content": "B"}}]}])
    assert merged["id"] == "chatcmpl-b"
    assert [(c["index"], c["message"]["content"]) for c in merged["choices"]] == [(0, "A"), (1, "B")]
    assert merged["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"use_beam_search": True}, "use_beam_search"),
        ({"stream": True}, "stream"),
        ({"messages": []}, "messages"),
    ],
)
def test_batch_refusals_as_vllm(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(errors.ApiError) as raised:
        batch_chat.split(
            {"model": "m", "messages": [[{"role": "user", "content": "a"}]], **fields}, RequestLimits(), 32
        )
    assert raised.value.status == 400 and raised.value.body()["error"]["param"] == param
