"""One streamed request to an OpenAI-compatible server, timed chunk by chunk."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from tools.bench.config import BenchConfig
from tools.bench.sse import SseDecoder, SseEvent, parse_chunk

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass(frozen=True)
class Exchange:
    """An earlier turn of a session: what the user sent and what the server answered."""

    user: str
    assistant: str


def request_body(
    config: BenchConfig, history: Sequence[Exchange], user_text: str, max_tokens: int
) -> dict[str, Any]:
    """The JSON body of a streamed request carrying `user_text` after `history`."""
    body: dict[str, Any] = {"model": config.model}
    if config.api == "chat":
        messages = []
        for exchange in history:
            messages.append({"role": "user", "content": exchange.user})
            messages.append({"role": "assistant", "content": exchange.assistant})
        body["messages"] = [*messages, {"role": "user", "content": user_text}]
    else:
        # Each prompt extends the previous prompt + answer verbatim, so a server with prefix
        # caching can reuse the session's earlier tokens, as it would for chat.
        body["prompt"] = "".join(f"{e.user}{e.assistant}\n" for e in history) + user_text
    body.update(
        max_tokens=max_tokens,
        temperature=config.temperature,
        stream=True,
        stream_options={"include_usage": True},
    )
    if config.min_tokens:
        body["min_tokens"] = max_tokens
    if config.ignore_eos:
        body["ignore_eos"] = True
    return body


@dataclass
class Outcome:
    """A request's measurements (seconds) and answer; `error` is None when it succeeded."""

    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    content_chunks: int = 0
    completion_tokens: int | None = None  # from the usage chunk
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # with --enable-prompt-tokens-details
    text: str = ""

    @property
    def output_tokens(self) -> int:
        return self.completion_tokens if self.completion_tokens is not None else self.content_chunks


class _Stream:
    """Accumulates a stream's events into an Outcome."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.last_content: float | None = None
        self.done = False
        self.pieces: list[str] = []
        self.outcome = Outcome()

    def on_event(self, event: SseEvent, now: float) -> bool:
        """Handles one event; True when the stream is over ([DONE] or an error)."""
        chunk = parse_chunk(event)
        if chunk.error is not None:
            self.outcome.error = chunk.error
            return True
        if chunk.done:
            self.done = True
            return True
        if chunk.text:
            if self.last_content is None:
                self.outcome.ttft_s = now - self.start
            else:
                self.outcome.itl_s.append(now - self.last_content)
            self.last_content = now
            self.outcome.content_chunks += 1
            self.pieces.append(chunk.text)
        if chunk.usage is not None:
            self.outcome.completion_tokens = chunk.usage.completion_tokens
            self.outcome.prompt_tokens = chunk.usage.prompt_tokens
            self.outcome.cached_tokens = chunk.usage.cached_tokens
        return False


def _http_error(status: int, raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace")
    try:
        error = json.loads(text).get("error")
        message = error.get("message") if isinstance(error, dict) else error
        if message:
            text = str(message)
    except (ValueError, AttributeError):
        pass
    return f"HTTP {status}: {text.strip()[:300]}"


async def stream_request(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> Outcome:
    """POSTs `body` with streaming on; transport and server errors end up in Outcome.error."""
    start = time.perf_counter()
    stream = _Stream(start)
    try:
        async with client.stream("POST", path, json=body) as response:
            if response.status_code != httpx.codes.OK:
                stream.outcome.error = _http_error(response.status_code, await response.aread())
            else:
                decoder = SseDecoder()
                finished = False
                async for line in response.aiter_lines():
                    event = decoder.feed(line)
                    if event is not None and stream.on_event(event, time.perf_counter()):
                        finished = True
                        break
                last = None if finished else decoder.flush()
                if last is not None:
                    stream.on_event(last, time.perf_counter())
                if stream.outcome.error is None and not stream.done:
                    stream.outcome.error = "stream ended before [DONE]"
    except httpx.HTTPError as exc:
        stream.outcome.error = f"{type(exc).__name__}: {exc}".rstrip(": ")
    outcome = stream.outcome
    outcome.e2e_s = time.perf_counter() - start
    outcome.text = "".join(stream.pieces)
    return outcome
