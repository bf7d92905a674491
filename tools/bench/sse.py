"""Server-sent events of OpenAI-style streams: decoding lines into events, and events into
the text, usage and errors of completion / chat completion chunks."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SseEvent:
    data: str
    event: str = "message"


class SseDecoder:
    """Incremental text/event-stream decoder (the WHATWG rules for `event` and `data` fields;
    `id`, `retry` and comments are ignored). Feed it lines without their line terminator."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []

    def feed(self, line: str) -> SseEvent | None:
        """Returns the event that a blank line completes, else None."""
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None

    def flush(self) -> SseEvent | None:
        """The last event, if the stream ended without its closing blank line."""
        return self._dispatch()

    def _dispatch(self) -> SseEvent | None:
        data, event = self._data, self._event
        self._data, self._event = [], ""
        if not data:
            return None
        return SseEvent("\n".join(data), event or "message")


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int | None
    completion_tokens: int | None
    # Prompt tokens the engine did not compute (prompt_tokens_details, when the server reports it).
    cached_tokens: int | None = None


@dataclass(frozen=True)
class Chunk:
    """What one event of a completion stream carries."""

    text: str = ""  # content of all choices in this chunk, concatenated
    usage: Usage | None = None
    error: str | None = None
    done: bool = False  # the `[DONE]` sentinel


def _error_message(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or json.dumps(error))
    return str(error)


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_chunk(event: SseEvent) -> Chunk:
    """Interprets a /v1/completions or /v1/chat/completions stream event."""
    if event.data.strip() == "[DONE]":
        return Chunk(done=True)
    try:
        payload = json.loads(event.data)
    except json.JSONDecodeError:
        if event.event == "error":
            return Chunk(error=event.data)
        return Chunk(error=f"malformed stream data: {event.data[:200]!r}")
    if not isinstance(payload, dict):
        return Chunk(error=f"unexpected stream data: {event.data[:200]!r}")
    if "error" in payload or event.event == "error":
        return Chunk(error=_error_message(payload.get("error", payload)))
    texts = []
    for choice in payload.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        # Chat chunks carry delta.content; completion chunks carry text.
        content = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if isinstance(content, str):
            texts.append(content)
    usage = payload.get("usage")
    return Chunk(
        text="".join(texts),
        usage=Usage(
            _int_or_none(usage.get("prompt_tokens")),
            _int_or_none(usage.get("completion_tokens")),
            _int_or_none((usage.get("prompt_tokens_details") or {}).get("cached_tokens")),
        )
        if isinstance(usage, dict)
        else None,
    )
