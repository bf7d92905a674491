"""The OpenAI batch file format, as vLLM's `run_batch` reads and writes it.

Input, one request per line:
    {"custom_id": "q1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}
Output, one line per input line (vLLM's BatchRequestOutput, compact JSON):
    {"id": "cleave-…", "custom_id": "q1",
     "response": {"status_code": 200, "request_id": "cleave-batch-…", "body": {...}},
     "error": null}

As in vLLM: a line the tool itself refuses gets status 400, no body and the reason as a string
in `error`; an HTTP error from the server gets that status, no body and the server's
`{"error": {...}}` object in `error`; a request that never got an HTTP answer (a timeout) gets
`response: null`. Where vLLM would stop the whole batch (a line that is not JSON, a repeated
custom_id), this tool writes an error line for that line and goes on.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

SUPPORTED_URLS = ("/v1/chat/completions", "/v1/completions")

# vLLM's own message for a streaming request in a batch.
STREAM_ERROR = "Request must not be sent in stream mode"
# Error lines for a repeated custom_id start with this, so that a resumed run can tell them
# from the line of the request that custom_id names.
DUPLICATE_PREFIX = "duplicate custom_id: "


@dataclass(frozen=True)
class BatchRequest:
    line_number: int  # 1-based, in the input file
    custom_id: str
    url: str
    body: dict[str, Any]


@dataclass(frozen=True)
class InvalidLine:
    """A line that is not sent. custom_id is None when the line does not name one."""

    line_number: int
    custom_id: str | None
    message: str


def parse_line(text: str, line_number: int) -> BatchRequest | InvalidLine | None:
    """One input line; None for a blank line (vLLM skips those too)."""
    text = text.strip()
    if not text:
        return None
    try:
        item = json.loads(text)
    except json.JSONDecodeError as error:
        return InvalidLine(line_number, None, f"input line {line_number}: not valid JSON ({error})")
    if not isinstance(item, dict):
        return InvalidLine(line_number, None, f"input line {line_number}: not a JSON object")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return InvalidLine(line_number, None, f"input line {line_number}: no custom_id string")

    def invalid(message: str) -> InvalidLine:
        return InvalidLine(line_number, custom_id, message)

    url = item.get("url")
    if url not in SUPPORTED_URLS:
        return invalid(f"URL {url} was used. Supported endpoints: {', '.join(SUPPORTED_URLS)}.")
    method = item.get("method")
    if method != "POST":
        return invalid(f"method {method!r} was used; only POST is supported.")
    body = item.get("body")
    if not isinstance(body, dict):
        return invalid("body must be a JSON object")
    if body.get("stream"):
        return invalid(STREAM_ERROR)
    return BatchRequest(line_number, custom_id, url, body)


def duplicate_message(custom_id: str, line_number: int, first_line: int) -> str:
    return (
        f"{DUPLICATE_PREFIX}{custom_id!r} on input line {line_number} was already used on line {first_line}"
    )


def _random_hex() -> str:
    return uuid.uuid4().hex[:16]


def _record(custom_id: str | None, response: dict[str, Any] | None, error: Any) -> dict[str, Any]:
    return {"id": f"cleave-{_random_hex()}", "custom_id": custom_id, "response": response, "error": error}


def _response(status_code: int, body: Any) -> dict[str, Any]:
    return {"status_code": status_code, "request_id": f"cleave-batch-{_random_hex()}", "body": body}


def success_record(custom_id: str, status_code: int, body: Any) -> dict[str, Any]:
    return _record(custom_id, _response(status_code, body), None)


def http_error_record(custom_id: str, status_code: int, payload: Any) -> dict[str, Any]:
    """The server answered with an error status; `payload` is its JSON body, or its text."""
    if not (isinstance(payload, dict) and isinstance(payload.get("error"), dict)):
        message = payload if isinstance(payload, str) else json.dumps(payload)
        payload = {"error": {"message": message, "type": "server_error", "param": None, "code": status_code}}
    return _record(custom_id, _response(status_code, None), payload)


def local_error_record(custom_id: str | None, message: str) -> dict[str, Any]:
    """A line this tool refused (vLLM's make_error_request_output: 400 and the message)."""
    return _record(custom_id, _response(400, None), message)


def no_response_record(custom_id: str, message: str) -> dict[str, Any]:
    """No HTTP answer at all (a timeout): OpenAI's "non-HTTP error", response null."""
    return _record(custom_id, None, message)


def encode(record: dict[str, Any]) -> bytes:
    """One output line, newline included, compact like pydantic's model_dump_json."""
    return (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
