"""Parsing batch input lines and building output lines in vLLM's run-batch format."""

from __future__ import annotations

import json

import pytest

from tools.run_batch.batch_format import (
    STREAM_ERROR,
    BatchRequest,
    InvalidLine,
    encode,
    http_error_record,
    local_error_record,
    no_response_record,
    parse_line,
    success_record,
)


def line(**fields: object) -> str:
    item: dict[str, object] = {
        "custom_id": "q1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"max_tokens": 3},
    }
    item.update(fields)
    return json.dumps(item)


def test_a_chat_and_a_completion_line_parse() -> None:
    assert parse_line(line(), 4) == BatchRequest(4, "q1", "/v1/chat/completions", {"max_tokens": 3})
    parsed = parse_line(line(url="/v1/completions", body={"prompt": "x"}), 5)
    assert parsed == BatchRequest(5, "q1", "/v1/completions", {"prompt": "x"})


def test_blank_lines_are_skipped() -> None:
    assert parse_line("   \n", 1) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"custom_id": "q1", ', "input line 7: not valid JSON"),
        ("[1, 2]", "input line 7: not a JSON object"),
        ('{"method": "POST"}', "input line 7: no custom_id string"),
        ('{"custom_id": 5}', "input line 7: no custom_id string"),
    ],
)
def test_lines_without_a_usable_custom_id_are_refused_with_their_line_number(text: str, message: str) -> None:
    parsed = parse_line(text, 7)
    assert isinstance(parsed, InvalidLine)
    assert parsed.custom_id is None
    assert parsed.message.startswith(message)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"url": "/v1/embeddings"},
            "URL /v1/embeddings was used. Supported endpoints: /v1/chat/completions, /v1/completions.",
        ),
        ({"method": "GET"}, "method 'GET' was used; only POST is supported."),
        ({"body": "hello"}, "body must be a JSON object"),
        ({"body": {"stream": True}}, STREAM_ERROR),
    ],
)
def test_lines_that_cannot_be_sent_keep_their_custom_id(fields: dict[str, object], message: str) -> None:
    assert parse_line(line(**fields), 2) == InvalidLine(2, "q1", message)


def test_a_success_line_has_vllms_shape() -> None:
    record = json.loads(encode(success_record("q1", 200, {"object": "chat.completion"})))
    assert list(record) == ["id", "custom_id", "response", "error"]
    assert record["id"].startswith("cleave-") and record["custom_id"] == "q1" and record["error"] is None
    response = record["response"]
    assert list(response) == ["status_code", "request_id", "body"]
    assert response["status_code"] == 200 and response["body"] == {"object": "chat.completion"}
    assert response["request_id"].startswith("cleave-batch-")
    assert record["id"] != json.loads(encode(success_record("q1", 200, {})))["id"]


def test_a_server_error_keeps_the_servers_error_object() -> None:
    error = {"error": {"message": "too long", "type": "BadRequestError", "param": None, "code": 400}}
    record = http_error_record("q1", 400, error)
    assert record["response"]["status_code"] == 400 and record["response"]["body"] is None
    assert record["error"] == error


def test_a_server_error_without_an_error_object_is_wrapped_in_one() -> None:
    record = http_error_record("q1", 503, "Service Unavailable")
    assert record["error"] == {
        "error": {"message": "Service Unavailable", "type": "server_error", "param": None, "code": 503}
    }


def test_local_and_transport_errors() -> None:
    refused = local_error_record(None, "input line 3: not valid JSON")
    assert refused["custom_id"] is None and refused["response"]["status_code"] == 400
    assert refused["error"] == "input line 3: not valid JSON"
    timed_out = no_response_record("q1", "no answer within 5 s")
    assert timed_out["response"] is None and timed_out["error"] == "no answer within 5 s"


def test_encoded_lines_are_one_compact_line_each() -> None:
    data = encode(success_record("q1", 200, {"text": "two\nlines", "emoji": "🙂"}))
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    assert b'"custom_id":"q1"' in data and "🙂".encode() in data
