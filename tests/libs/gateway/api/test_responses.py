"""Whole (non-streamed) response bodies built from scripted pipeline events."""

from __future__ import annotations

import time
from typing import Any

import pytest

from libs.gateway.api import responses
from libs.gateway.common import errors
from libs.gateway.common.errors import MidStreamError
from libs.gateway.common.generation import Finished, SequenceEvent
from tests.libs.gateway.fakes import FakeTokenizer, ScriptedServing, spec, token

pytestmark = pytest.mark.anyio


def texts(tokenizer: FakeTokenizer | None = None) -> responses.TokenizerTexts:
    unused: Any = tokenizer or FakeTokenizer()
    return responses.TokenizerTexts(unused)


def two_sequences() -> ScriptedServing:
    """n=2, interleaved as a decode worker sends them; sequence 1 hits max_tokens."""
    return ScriptedServing(
        [
            SequenceEvent(0, "Hello", [1], [token(1, -0.5, (1, -0.5), (6, -1.0))]),
            SequenceEvent(1, "Hello", [1], [token(1, -0.25)]),
            SequenceEvent(0, " world", [3], [token(3, -1.0, (3, -1.0), (4, -2.0))], "stop"),
            SequenceEvent(1, " there", [6], [token(6, -2.0)], "length"),
            Finished(prompt_tokens=2, completion_tokens=4, cached_prompt_tokens=0),
        ]
    )


async def test_collect_joins_each_sequences_events_into_its_choice() -> None:
    generation = await responses.collect(two_sequences().generate, spec(n=2))
    assert generation.choices[0].text == "Hello world"
    assert generation.choices[0].finish_reason == "stop"
    assert [e.token_id for e in generation.choices[0].logprobs] == [1, 3]
    assert generation.choices[1].text == "Hello there"
    assert generation.choices[1].finish_reason == "length"
    assert generation.finished == Finished(2, 4, 0)


async def test_collect_turns_a_mid_stream_failure_into_a_502() -> None:
    pipeline = ScriptedServing([SequenceEvent(0, "Hello", [1])], error=MidStreamError("decode died"))
    with pytest.raises(errors.ApiError) as raised:
        await responses.collect(pipeline.generate, spec())
    assert raised.value.status == 502
    assert raised.value.body() == {
        "error": {"message": "decode died", "type": "server_error", "param": None, "code": "worker_failed"}
    }


async def test_collect_refuses_a_generation_that_never_finished() -> None:
    with pytest.raises(errors.ApiError, match="ended without completing") as raised:
        await responses.collect(
            ScriptedServing([SequenceEvent(0, "Hello", [1], [], "stop")]).generate, spec()
        )
    assert raised.value.status == 502


async def test_chat_completion_body_with_two_choices_and_no_logprobs() -> None:
    generation = await responses.collect(two_sequences().generate, spec(n=2, request_id="abc"))
    body = await responses.chat_completion(
        spec(n=2, request_id="abc"), generation, model="m", top_logprobs=None, token_text=texts().token_texts
    )
    assert abs(body.pop("created") - time.time()) < 5
    assert body == {
        "id": "chatcmpl-abc",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello world"},
                "logprobs": None,
                "finish_reason": "stop",
                "stop_reason": None,
                "token_ids": None,
            },
            {
                "index": 1,
                "message": {"role": "assistant", "content": "Hello there"},
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": None,
            },
        ],
        # Present and null, as vLLM's response model dumps them.
        "service_tier": None,
        "system_fingerprint": None,
        "prompt_logprobs": None,
        "usage": {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6},
    }


async def test_chat_logprobs_give_text_bytes_and_the_top_alternatives_by_rank() -> None:
    entries = [token(1, -0.5, (1, -0.5), (6, -1.0), (4, -3.0)), token(5, -0.25, (5, -0.25))]
    logprobs = await responses.chat_logprobs(entries, 2, texts().token_texts)
    assert logprobs == {
        "content": [
            {
                "token": "Hello",
                "logprob": -0.5,
                "bytes": list(b"Hello"),
                "top_logprobs": [
                    {"token": "Hello", "logprob": -0.5, "bytes": list(b"Hello")},
                    {"token": " there", "logprob": -1.0, "bytes": list(b" there")},
                ],
            },
            {
                "token": "é",
                "logprob": -0.25,
                "bytes": [0xC3, 0xA9],
                "top_logprobs": [{"token": "é", "logprob": -0.25, "bytes": [0xC3, 0xA9]}],
            },
        ]
    }


async def test_chat_completion_with_zero_top_logprobs_still_gives_the_sampled_tokens() -> None:
    generation = await responses.collect(two_sequences().generate, spec(n=2))
    body = await responses.chat_completion(
        spec(n=2), generation, model="m", top_logprobs=0, token_text=texts().token_texts
    )
    first = body["choices"][0]["logprobs"]["content"]
    assert [(c["token"], c["logprob"], c["top_logprobs"]) for c in first] == [
        ("Hello", -0.5, []),
        (" world", -1.0, []),
    ]


async def test_completion_logprobs_give_offsets_and_top_alternatives_as_a_map() -> None:
    entries = [token(1, -0.5, (1, -0.5), (6, -1.0)), token(3, -1.0, (3, -1.0), (4, -2.0))]
    logprobs = await responses.completion_logprobs(entries, 1, texts().token_texts)
    assert logprobs == {
        "tokens": ["Hello", " world"],
        "token_logprobs": [-0.5, -1.0],
        "top_logprobs": [{"Hello": -0.5}, {" world": -1.0}],
        "text_offset": [0, 5],
    }


async def test_each_distinct_token_is_detokenized_once_and_on_its_own() -> None:
    tokenizer = FakeTokenizer()
    entries = [token(1, -0.5, (1, -0.5), (6, -1.0)), token(1, -0.5, (1, -0.5))]
    await responses.completion_logprobs(entries, 2, texts(tokenizer).token_texts)
    assert tokenizer.detokenized == [[1], [6]]


async def test_text_completion_numbers_choices_per_prompt_echoes_and_sums_usage() -> None:
    specs = [
        spec(n=2, prompt=[1, 2], request_id="first", prompt_tokens_details=True),
        spec(n=2, prompt=[5], request_id="second", prompt_tokens_details=True),
    ]
    generations = [
        await responses.collect(two_sequences().generate, specs[0]),
        await responses.collect(
            ScriptedServing(
                [
                    SequenceEvent(0, "!", [4], [token(4, -0.25)], "stop"),
                    SequenceEvent(1, " world", [3], [token(3, -0.5)], "stop"),
                    Finished(prompt_tokens=1, completion_tokens=2, cached_prompt_tokens=1),
                ]
            ).generate,
            specs[1],
        ),
    ]
    body = await responses.text_completion(
        specs, generations, model="m", logprobs=None, echo=True, texts=texts()
    )
    assert body["id"] == "cmpl-first"
    assert body["object"] == "text_completion"
    assert [(c["index"], c["text"], c["finish_reason"], c["logprobs"]) for c in body["choices"]] == [
        (0, "Hello,Hello world", "stop", None),
        (1, "Hello,Hello there", "length", None),
        (2, "é!", "stop", None),
        (3, "é world", "stop", None),
    ]
    assert body["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 6,
        "total_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 1},
    }


async def test_text_completion_logprobs_without_echo() -> None:
    generation = await responses.collect(two_sequences().generate, spec(n=2))
    body = await responses.text_completion(
        [spec(n=2)], [generation], model="m", logprobs=1, echo=False, texts=texts()
    )
    assert body["choices"][0]["text"] == "Hello world"
    assert body["choices"][0]["logprobs"] == {
        "tokens": ["Hello", " world"],
        "token_logprobs": [-0.5, -1.0],
        "top_logprobs": [{"Hello": -0.5}, {" world": -1.0}],
        "text_offset": [0, 5],
    }
    assert body["choices"][1]["logprobs"]["tokens"] == ["Hello", " there"]


def test_usage_reports_cached_tokens_only_when_there_are_some_and_details_are_on() -> None:
    plain = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    assert responses.usage(7, 3, 0, details=True) == plain
    assert responses.usage(7, 3, 4, details=True)["prompt_tokens_details"] == {"cached_tokens": 4}
    assert responses.usage(7, 3, 4, details=False) == plain  # vLLM's default


def test_sse_frames_json_and_the_done_marker() -> None:
    assert responses.sse({"text": "é"}) == 'data: {"text": "é"}\n\n'
    assert responses.sse("[DONE]") == "data: [DONE]\n\n"


async def test_logprobs_keep_vllms_order_sampled_token_first_then_the_best() -> None:
    # The sampled token (6, " there") is third best: vLLM's dict is {6, 1, 3} for top 2.
    entries = [token(6, -2.0, (1, -0.5), (3, -1.0), (6, -2.0))]
    completion = await responses.completion_logprobs(entries, 2, texts().token_texts)
    assert list(completion["top_logprobs"][0].items()) == [
        (" there", -2.0),
        ("Hello", -0.5),
        (" world", -1.0),
    ]
    # logprobs=0: the sampled token's own entry, as vLLM's server gives it.
    assert (await responses.completion_logprobs(entries, 0, texts().token_texts))["top_logprobs"] == [
        {" there": -2.0}
    ]
    chat = await responses.chat_logprobs(entries, 2, texts().token_texts)
    assert [t["token"] for t in chat["content"][0]["top_logprobs"]] == [" there", "Hello"]


async def test_minus_infinity_is_minus_9999_as_in_openais_api() -> None:
    entries = [token(1, float("-inf"), (1, float("-inf")))]
    completion = await responses.completion_logprobs(entries, 1, texts().token_texts)
    assert completion["token_logprobs"] == [-9999.0] and completion["top_logprobs"] == [{"Hello": -9999.0}]


async def test_token_texts_come_from_the_tokenizers_decoder_when_it_gave_one() -> None:
    class Decoder:
        def vocab_size(self) -> int:
            return 10

        def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
            return "".join(f"<{i}>" for i in ids)

    tokenizer = FakeTokenizer()
    texts = responses.TokenizerTexts(tokenizer, Decoder())  # type: ignore[arg-type]
    assert await texts.token_texts([1, 3]) == {1: "<1>", 3: "<3>"}
    assert await texts.text([1, 3]) == "<1><3>"
    assert tokenizer.detokenized == []  # no tokenizer call
