"""The SSE chunk sequence of streamed responses, for scripted pipeline events."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from prometheus_client import REGISTRY

from cleave.common.v1 import common_pb2
from libs.config.roles import Role
from libs.gateway.api.openai_api import StreamOptions
from libs.gateway.api.responses import TokenizerTexts
from libs.gateway.api.streaming import StreamFormat, sse_events
from libs.gateway.common import errors
from libs.gateway.common.errors import MidStreamError
from libs.gateway.common.generation import Finished, SequenceEvent
from tests.libs.gateway.fakes import FakeTokenizer, ScriptedServing, spec, token

pytestmark = pytest.mark.anyio

TWO_SEQUENCES: list[SequenceEvent | Finished] = [
    SequenceEvent(0, "Hello", [1]),
    SequenceEvent(1, "", [2]),  # a token whose text is held back (e.g. half a character)
    SequenceEvent(0, " world", [3], finish_reason="stop"),
    SequenceEvent(1, "é", [5], finish_reason="length"),
    Finished(prompt_tokens=2, completion_tokens=4, cached_prompt_tokens=1),
]


def stream_format(*, chat: bool, top: int = 0, **options: bool) -> StreamFormat:
    return StreamFormat(chat=chat, model="m", options=StreamOptions(**options), top_logprobs=top)


async def stream(
    pipeline: ScriptedServing, fmt: StreamFormat, *, n: int = 1, details: bool = True
) -> list[Any]:
    """The events' payloads: parsed JSON objects, or the raw "[DONE]"."""
    unused: Any = FakeTokenizer()
    payloads = []
    generation = spec(n=n, request_id="abc", prompt_tokens_details=details)
    async for event in sse_events(pipeline.generate, generation, fmt, TokenizerTexts(unused).token_texts):
        assert event.startswith("data: ") and event.endswith("\n\n")
        data = event[len("data: ") : -2]
        payloads.append(data if data == "[DONE]" else json.loads(data))
    return payloads


async def test_chat_stream_opens_with_roles_then_deltas_usage_and_done() -> None:
    payloads = await stream(ScriptedServing(TWO_SEQUENCES), stream_format(chat=True, include_usage=True), n=2)
    assert payloads[-1] == "[DONE]"
    chunks = payloads[:-1]
    assert {(c["id"], c["object"], c["model"]) for c in chunks} == {
        ("chatcmpl-abc", "chat.completion.chunk", "m")
    }
    assert all(isinstance(c["created"], int) for c in chunks)
    assert [c["choices"] for c in chunks] == [
        [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            },
            {
                "index": 1,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            },
        ],
        [
            {
                "index": 0,
                "delta": {"content": "Hello"},
                "logprobs": None,
                "finish_reason": None,
                "stop_reason": None,
            }
        ],
        [{"index": 1, "delta": {}, "logprobs": None, "finish_reason": None, "stop_reason": None}],
        [
            {
                "index": 0,
                "delta": {"content": " world"},
                "logprobs": None,
                "finish_reason": "stop",
                "stop_reason": None,
            }
        ],
        [
            {
                "index": 1,
                "delta": {"content": "é"},
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
            }
        ],
        [],
    ]
    assert "usage" not in chunks[1]
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 2,
        "completion_tokens": 4,
        "total_tokens": 6,
        "prompt_tokens_details": {"cached_tokens": 1},
    }


async def test_cached_tokens_are_reported_only_with_prompt_tokens_details() -> None:
    fmt = stream_format(chat=True, include_usage=True)
    hidden = await stream(ScriptedServing(TWO_SEQUENCES), fmt, n=2, details=False)
    assert hidden[-2]["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}


async def test_completion_stream_has_no_role_chunk_and_no_usage_unless_asked() -> None:
    payloads = await stream(ScriptedServing(TWO_SEQUENCES), stream_format(chat=False), n=2)
    assert payloads[-1] == "[DONE]"
    assert {(c["id"], c["object"]) for c in payloads[:-1]} == {("cmpl-abc", "text_completion")}
    assert [c["choices"] for c in payloads[:-1]] == [
        [{"index": 0, "text": "Hello", "logprobs": None, "finish_reason": None, "stop_reason": None}],
        [{"index": 1, "text": "", "logprobs": None, "finish_reason": None, "stop_reason": None}],
        [{"index": 0, "text": " world", "logprobs": None, "finish_reason": "stop", "stop_reason": None}],
        [{"index": 1, "text": "é", "logprobs": None, "finish_reason": "length", "stop_reason": None}],
    ]
    assert not any("usage" in c for c in payloads[:-1])


async def test_continuous_usage_stats_count_the_tokens_streamed_so_far() -> None:
    events: list[SequenceEvent | Finished] = [
        SequenceEvent(0, "Hello,", [1, 2]),
        SequenceEvent(0, " world", [3], finish_reason="stop"),
        Finished(prompt_tokens=2, completion_tokens=3, cached_prompt_tokens=2),
    ]
    payloads = await stream(
        ScriptedServing(events), stream_format(chat=False, include_usage=True, continuous_usage_stats=True)
    )
    assert [c["usage"] for c in payloads[:-1]] == [
        {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4},
        {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5},
        # The last one is the pipeline's own count, with the cached prompt tokens.
        {
            "prompt_tokens": 2,
            "completion_tokens": 3,
            "total_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 2},
        },
    ]


async def test_continuous_usage_stats_on_chat_start_at_the_role_chunk_and_count_per_choice() -> None:
    # vLLM's chat stream (--enable-force-include-usage or continuous_usage_stats): the role
    # chunk has usage with 0 completion tokens; each later chunk counts its own choice's
    # tokens (previous_num_tokens[i]); the final usage sums them.
    payloads = await stream(
        ScriptedServing(TWO_SEQUENCES),
        stream_format(chat=True, include_usage=True, continuous_usage_stats=True),
        n=2,
    )
    counts = [(c["choices"][0]["index"] if c["choices"] else None, c["usage"]) for c in payloads[:-1]]
    running = [(index, u["completion_tokens"], u["total_tokens"] - u["prompt_tokens"]) for index, u in counts]
    assert running == [(0, 0, 0), (0, 1, 1), (1, 1, 1), (0, 2, 2), (1, 2, 2), (None, 4, 4)]


async def test_continuous_usage_stats_without_include_usage_send_no_usage() -> None:
    # As vLLM: continuous_usage_stats only adds to include_usage, it does not imply it.
    events: list[SequenceEvent | Finished] = [
        SequenceEvent(0, "Hello,", [1, 2]),
        SequenceEvent(0, " world", [3], finish_reason="stop"),
        Finished(prompt_tokens=2, completion_tokens=3, cached_prompt_tokens=0),
    ]
    for chat in (False, True):
        payloads = await stream(
            ScriptedServing(events), stream_format(chat=chat, continuous_usage_stats=True)
        )
        assert payloads[-1] == "[DONE]"
        assert not any("usage" in c for c in payloads[:-1])


async def test_streamed_logprobs_are_formatted_per_chunk() -> None:
    events: list[SequenceEvent | Finished] = [
        SequenceEvent(0, "Hello", [1], [token(1, -0.5, (1, -0.5), (6, -1.0))]),
        SequenceEvent(0, "", [], [], "stop"),
        Finished(prompt_tokens=2, completion_tokens=1, cached_prompt_tokens=0),
    ]
    completion = await stream(ScriptedServing(events), stream_format(chat=False, top=2))
    assert [c["choices"][0]["logprobs"] for c in completion[:-1]] == [
        {
            "tokens": ["Hello"],
            "token_logprobs": [-0.5],
            "top_logprobs": [{"Hello": -0.5, " there": -1.0}],
            "text_offset": [0],
        },
        None,
    ]
    chat = await stream(ScriptedServing(events), stream_format(chat=True, top=1))
    assert chat[1]["choices"][0]["logprobs"] == {
        "content": [
            {
                "token": "Hello",
                "logprob": -0.5,
                "bytes": list(b"Hello"),
                "top_logprobs": [{"token": "Hello", "logprob": -0.5, "bytes": list(b"Hello")}],
            }
        ]
    }


async def test_a_worker_failing_mid_stream_ends_with_an_error_object_then_done() -> None:
    pipeline = ScriptedServing([SequenceEvent(0, "Hello", [1])], error=MidStreamError("decode worker failed"))
    payloads = await stream(pipeline, stream_format(chat=True, include_usage=True))
    assert payloads[1]["choices"][0]["delta"] == {"content": "Hello"}
    assert payloads[2:] == [
        {
            "error": {
                "message": "decode worker failed",
                "type": "server_error",
                "param": None,
                "code": "worker_failed",
            }
        },
        "[DONE]",
    ]


async def test_an_api_error_before_any_token_is_sent_as_its_own_error_object() -> None:
    payloads = await stream(
        ScriptedServing([], error=errors.no_workers(Role.DECODE)), stream_format(chat=False)
    )
    assert payloads == [errors.no_workers(Role.DECODE).body(), "[DONE]"]


async def test_the_stream_stops_at_finished_even_if_the_pipeline_would_go_on() -> None:
    events: list[SequenceEvent | Finished] = [
        SequenceEvent(0, "Hello", [1], finish_reason="stop"),
        Finished(prompt_tokens=2, completion_tokens=1, cached_prompt_tokens=0),
        SequenceEvent(0, "late", [4]),
    ]
    payloads = await stream(ScriptedServing(events), stream_format(chat=False))
    assert [c["choices"][0]["text"] for c in payloads[:-1]] == ["Hello"]
    assert payloads[-1] == "[DONE]"


async def test_a_client_that_goes_away_cancels_the_pipeline_without_more_events() -> None:
    pipeline = ScriptedServing([SequenceEvent(0, "Hello", [1])], hang=True)
    unused: Any = FakeTokenizer()
    received: list[str] = []

    async def client() -> None:
        async for event in sse_events(
            pipeline.generate, spec(), stream_format(chat=False), TokenizerTexts(unused).token_texts
        ):
            received.append(event)

    task = asyncio.create_task(client())
    await asyncio.wait_for(pipeline.waiting.wait(), 5)
    task.cancel()  # what the HTTP server does when the client disconnects
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pipeline.closed.is_set()
    assert len(received) == 1 and '"text": "Hello"' in received[0]


def sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def test_latency_metrics_observe_first_token_gaps_and_the_whole_stream() -> None:
    before = {
        name: sample(name)
        for name in (
            "cleave_gateway_ttft_seconds_count",
            "cleave_gateway_itl_seconds_count",
            "cleave_gateway_e2e_seconds_count",
            "cleave_gateway_completion_tokens_sum",
        )
    }
    await stream(ScriptedServing(TWO_SEQUENCES), stream_format(chat=True), n=2)
    assert sample("cleave_gateway_ttft_seconds_count") - before["cleave_gateway_ttft_seconds_count"] == 1
    assert sample("cleave_gateway_itl_seconds_count") - before["cleave_gateway_itl_seconds_count"] == 3
    assert sample("cleave_gateway_e2e_seconds_count") - before["cleave_gateway_e2e_seconds_count"] == 1
    assert (
        sample("cleave_gateway_completion_tokens_sum") - before["cleave_gateway_completion_tokens_sum"] == 4
    )


async def test_chat_stream_with_vllm_role_echo_and_token_ids() -> None:
    events: list[SequenceEvent | Finished] = [
        SequenceEvent(0, " world", [3], finish_reason="stop", stop_reason=3),
        Finished(prompt_tokens=2, completion_tokens=1, cached_prompt_tokens=0),
    ]
    fmt = StreamFormat(
        chat=True,
        model="m",
        options=StreamOptions(),
        top_logprobs=0,
        return_token_ids=True,
        role="user",
        echo_text="Hello",
    )
    payloads = await stream(ScriptedServing(events), fmt)
    roles, echo, content = payloads[0], payloads[1], payloads[2]
    # vLLM: the reply's role first, with the prompt's ids once; then the echoed content.
    assert roles["choices"][0]["delta"] == {"role": "user", "content": ""}
    assert roles["prompt_token_ids"] == [1, 2]
    assert echo["choices"][0]["delta"] == {"content": "Hello"} and "prompt_token_ids" not in echo
    assert content["choices"][0]["token_ids"] == [3] and content["choices"][0]["stop_reason"] == 3


async def test_completion_stream_echo_and_prompt_ids_on_each_choices_first_chunk() -> None:
    fmt = StreamFormat(
        chat=False, model="m", options=StreamOptions(), top_logprobs=0, return_token_ids=True, echo_text="P:"
    )
    payloads = await stream(ScriptedServing(TWO_SEQUENCES), fmt, n=2)
    choices = [c["choices"][0] for c in payloads[:-1]]
    assert [c["text"] for c in choices] == ["P:Hello", "P:", " world", "é"]
    assert [c.get("prompt_token_ids") for c in choices] == [[1, 2], [1, 2], None, None]
    assert [c["token_ids"] for c in choices] == [[1], [2], [3], [5]]


async def test_completion_stream_echo_with_logprobs_leads_with_the_prompts_and_offsets_run_on() -> None:
    # vLLM's completion_stream_generator: the first chunk echoes the prompt with its logprobs
    # (the first token has none) before the first generated token's; text offsets continue.
    prompt_entries = [common_pb2.TokenLogprob(), token(2, -2.0, (4, -0.125), (2, -2.0))]
    events: list[SequenceEvent | Finished] = [
        SequenceEvent(0, " world", [3], [token(3, -0.5, (3, -0.5))], prompt_logprobs=prompt_entries),
        SequenceEvent(0, "!", [4], [token(4, -0.25, (4, -0.25))], "stop"),
        Finished(prompt_tokens=2, completion_tokens=2, cached_prompt_tokens=0),
    ]
    fmt = StreamFormat(chat=False, model="m", options=StreamOptions(), top_logprobs=1, echo_text="Hello,")
    first, second = [c["choices"][0] for c in (await stream(ScriptedServing(events), fmt))[:-1]]
    assert first["text"] == "Hello, world"
    assert first["logprobs"] == {
        "tokens": ["Hello", ",", " world"],
        "token_logprobs": [None, -2.0, -0.5],
        "top_logprobs": [None, {",": -2.0, "!": -0.125}, {" world": -0.5}],
        "text_offset": [0, 5, 6],
    }
    assert second["logprobs"] == {
        "tokens": ["!"], "token_logprobs": [-0.25], "top_logprobs": [{"!": -0.25}], "text_offset": [12]
    }  # fmt: skip


@pytest.mark.parametrize("chat", [True, False])
async def test_a_plain_token_chunk_is_the_same_bytes_as_the_encoded_dict(chat: bool) -> None:
    from libs.gateway.api.streaming import _Chunks

    unused: Any = FakeTokenizer()
    model = 'm "quoted" ü'
    fmt = StreamFormat(chat=chat, model=model, options=StreamOptions(), top_logprobs=0)
    chunks = _Chunks(spec(request_id='a"b'), fmt)
    events = [
        SequenceEvent(0, "Hello", [1]),
        SequenceEvent(1, "", [2]),
        SequenceEvent(0, 'quote " back\\slash \n newline é 漢 \u2028', [3]),
        SequenceEvent(0, " end", [4], finish_reason="stop", stop_reason=7),
        SequenceEvent(2, "x", [5], finish_reason="stop", stop_reason="STOP é"),
        SequenceEvent(0, "", [6], finish_reason="length"),
    ]
    for event in events:
        plain = await chunks.event(event, TokenizerTexts(unused).token_texts)
        encoded = chunks.chunk([await chunks.choice(event, TokenizerTexts(unused).token_texts)])
        assert plain == encoded
