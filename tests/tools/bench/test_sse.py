from __future__ import annotations

import json

from tools.bench.sse import Chunk, SseDecoder, SseEvent, Usage, parse_chunk


def decode(lines: list[str]) -> list[SseEvent]:
    decoder = SseDecoder()
    events = [event for line in lines if (event := decoder.feed(line)) is not None]
    last = decoder.flush()
    return [*events, last] if last is not None else events


def test_decoder_splits_events_on_blank_lines() -> None:
    lines = [": keep-alive comment", 'data: {"a": 1}', "", "data:no-space", "", "", "data: [DONE]", ""]
    assert decode(lines) == [SseEvent('{"a": 1}'), SseEvent("no-space"), SseEvent("[DONE]")]


def test_decoder_joins_multiline_data_and_reads_event_names() -> None:
    lines = ["event: error", "data: first", "data:  second", "id: 3", "retry: 10", ""]
    assert decode(lines) == [SseEvent("first\n second", event="error")]
    # The event name applies to one event only.
    assert decode(["event: error", "data: x", "", "data: y", ""])[1] == SseEvent("y")


def test_decoder_flushes_an_unterminated_last_event() -> None:
    assert decode(["data: [DONE]"]) == [SseEvent("[DONE]")]
    assert decode(["event: ping", ""]) == []  # no data, no event


def data(payload: object) -> SseEvent:
    return SseEvent(json.dumps(payload))


def test_completion_and_chat_chunks_carry_their_text() -> None:
    assert parse_chunk(data({"choices": [{"index": 0, "text": " hello", "finish_reason": None}]})) == Chunk(
        text=" hello"
    )
    assert parse_chunk(data({"choices": [{"index": 0, "delta": {"content": "hi"}}]})).text == "hi"
    role_only = parse_chunk(data({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}))
    assert role_only == Chunk(text="")
    finish = parse_chunk(data({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}))
    assert finish == Chunk(text="")
    both = data(
        {"choices": [{"index": 0, "delta": {"content": "a"}}, {"index": 1, "delta": {"content": "b"}}]}
    )
    assert parse_chunk(both).text == "ab"


def test_usage_chunk() -> None:
    chunk = parse_chunk(data({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 34}}))
    assert chunk == Chunk(text="", usage=Usage(prompt_tokens=12, completion_tokens=34))
    assert parse_chunk(data({"choices": [], "usage": None})).usage is None


def test_done_sentinel() -> None:
    assert parse_chunk(SseEvent("[DONE]")) == Chunk(done=True)


def test_error_events() -> None:
    body = {"error": {"message": "worker failed", "type": "server_error", "code": "worker_failed"}}
    assert parse_chunk(data(body)).error == "worker failed"
    assert parse_chunk(data({"error": "plain"})).error == "plain"
    assert parse_chunk(SseEvent("upstream died", event="error")).error == "upstream died"
    assert parse_chunk(SseEvent('{"message": "m"}', event="error")).error == "m"
    malformed = parse_chunk(SseEvent("{not json"))
    assert malformed.error is not None and "malformed" in malformed.error
