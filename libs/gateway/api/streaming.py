"""Pipeline events -> the server-sent events of a streamed completion or chat completion.

The chunk sequence follows vLLM's OpenAI server: chat opens with one role chunk per choice,
each pipeline event becomes one chunk, usage comes last when asked for, and the stream ends
with `data: [DONE]`. A failure after the response started cannot change the HTTP status, so
it is sent as an error object before [DONE].
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import structlog

from cleave.common.v1 import common_pb2
from libs.gateway.api.latency import LatencyClock
from libs.gateway.api.openai_api import StreamOptions
from libs.gateway.api.response_extras import echo_entries
from libs.gateway.api.responses import (
    Generate,
    TokenText,
    chat_logprobs,
    completion_logprobs,
    now,
    sse,
    usage,
    worker_failed,
)
from libs.gateway.api.tools import ToolCalling
from libs.gateway.common import errors
from libs.gateway.common.errors import MidStreamError
from libs.gateway.common.generation import Finished, GenerationSpec, SequenceEvent
from libs.observability.logging import bound_request_id

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class StreamFormat:
    chat: bool  # chat.completion.chunk objects with deltas, else text_completion ones
    model: str
    options: StreamOptions
    top_logprobs: int  # alternatives per token when the spec asks for logprobs
    tools: ToolCalling | None = None  # a chat request's tool calls (libs/gateway/api/tools.py)
    return_token_ids: bool = False  # vLLM's: each chunk's token ids (and the prompt's, first)
    role: str = "assistant"  # chat: the reply's role (add_generation_prompt false: the last message's)
    # vLLM's echo: chat's last message content (its own chunk after the roles), or the
    # completion's prompt text (before each choice's first text).
    echo_text: str = ""
    # Several prompts in one stream (multi_prompt.py): each choice's own prompt length, for
    # the running usage (vLLM's num_prompt_tokens[prompt_idx]); empty: the spec's prompt.
    choice_prompt_tokens: tuple[int, ...] = ()
    # The chunks' id after `chatcmpl-` / `cmpl-`: the client's request id (the spec's is the
    # internal one, libs/gateway/api/request_ids.py); empty: the spec's.
    response_id: str = ""


async def started(generate: Generate, spec: GenerationSpec) -> Generate:
    """Runs the pipeline up to its first event, then returns a `Generate` that replays it and
    streams the rest.

    Everything that can fail before the first token (admission's 429 with Retry-After, 503,
    the deadline's 504, a worker's refusal) then fails the response with its own HTTP status
    and headers, which clients such as OpenAI's SDKs act on (they retry 429s), instead of
    an error event inside a 200 stream. The cost: headers wait for the first token, which
    is when a client gets its first content anyway.
    """
    events = generate(spec)
    first = await anext(events)

    async def replay(_spec: GenerationSpec) -> AsyncIterator[SequenceEvent | Finished]:
        try:
            yield first
            async for event in events:
                yield event
        finally:
            if isinstance(events, AsyncGenerator):  # Pipeline.run's is one
                await events.aclose()  # releases the pipeline's workers if the client left early

    return replay


async def sse_events(
    generate: Generate,
    spec: GenerationSpec,
    fmt: StreamFormat,
    token_text: TokenText,
    *,
    started_s: float | None = None,
) -> AsyncIterator[str]:
    """The response body, one `data: ...` event at a time. `started_s` (perf_counter) is when
    the request began waiting for its first token (for the TTFT metric), if before this.

    When the client goes away the server cancels this generator while it awaits the
    pipeline; the cancellation reaches the pipeline's gRPC calls, which frees the workers.
    """
    chunks = _Chunks(spec, fmt)
    clock = LatencyClock(spec, started_s, streamed=True)
    # vLLM's rule (should_include_usage): continuous stats only with include_usage; each
    # chunk counts its own choice's tokens so far (previous_num_tokens[i]).
    continuous = fmt.options.include_usage and fmt.options.continuous_usage_stats
    completion_tokens: dict[int, int] = {}
    with bound_request_id(spec.request_id):
        try:
            if fmt.chat:
                yield chunks.roles(spec.sampling.n or 1, continuous=continuous)
                if fmt.echo_text:
                    yield chunks.echo(spec.sampling.n or 1, continuous=continuous)
            async for event in generate(spec):
                if isinstance(event, Finished):
                    clock.finished(event)
                    if fmt.options.include_usage:
                        yield chunks.chunk(
                            [],
                            usage=usage(
                                event.prompt_tokens,
                                event.completion_tokens,
                                event.cached_prompt_tokens,
                                details=spec.prompt_tokens_details,
                            ),
                        )
                    break
                clock.token_event(event)
                completion_tokens[event.index] = completion_tokens.get(event.index, 0) + len(event.token_ids)
                if not continuous:
                    yield await chunks.event(event, token_text)
                    continue
                choice = await chunks.choice(event, token_text)
                yield chunks.chunk(
                    [choice], usage=chunks.running_usage(completion_tokens[event.index], event.index)
                )
        except (errors.ApiError, MidStreamError) as error:
            body = error.body() if isinstance(error, errors.ApiError) else worker_failed(error).body()
            log.warning("stream failed", error=body["error"]["message"])
            yield sse(body)
        finally:
            chunks.close()  # the tool-call parsing streams still open, if any
        yield sse("[DONE]")


class _Chunks:
    """Builds one stream's chunks: the same id, object and model on each."""

    def __init__(self, spec: GenerationSpec, fmt: StreamFormat) -> None:
        self._fmt = fmt
        prefix = "chatcmpl" if fmt.chat else "cmpl"
        self._id = f"{prefix}-{fmt.response_id or spec.request_id}"
        self._prompt = list(spec.prompt_token_ids)
        self._started: set[int] = set()  # completion choices that sent their first chunk
        self._text_offsets: dict[int, int] = {}  # where each completion choice's next logprob text starts
        self._object = "chat.completion.chunk" if fmt.chat else "text_completion"
        self._tools = (fmt.tools or ToolCalling()).stream()
        # One creation time per stream, as vLLM's chunks carry.
        self._created = now()
        # A plain token chunk (no logprobs, tool calls, token ids or echo) is written from this
        # prefix and the event's own fields, not built as a dict and encoded whole: the same
        # bytes (`json.dumps`'s default separators), a fraction of the CPU per token.
        self._plain = not (self._tools.active or fmt.return_token_ids or fmt.echo_text)
        self._prefix = (
            f'data: {{"id": {json.dumps(self._id)}, "object": "{self._object}", "created": {self._created}, '
            f'"model": {json.dumps(fmt.model, ensure_ascii=False)}, "choices": [{{"index": '
        )

    def close(self) -> None:
        self._tools.close()

    async def event(self, event: SequenceEvent, token_text: TokenText) -> str:
        """One event's chunk as a server-sent event."""
        if self._plain and not event.logprobs:
            return self._plain_event(event)
        return self.chunk([await self.choice(event, token_text)])

    def _plain_event(self, event: SequenceEvent) -> str:
        text = event.text
        finish = "null" if event.finish_reason is None else json.dumps(event.finish_reason)
        stop = "null" if event.stop_reason is None else json.dumps(event.stop_reason, ensure_ascii=False)
        if self._fmt.chat:
            delta = f'{{"content": {json.dumps(text, ensure_ascii=False)}}}' if text else "{}"
            body = f'"delta": {delta}'
        else:
            body = f'"text": {json.dumps(text, ensure_ascii=False)}'
        return (
            f'{self._prefix}{event.index}, {body}, "logprobs": null, "finish_reason": {finish}, '
            f'"stop_reason": {stop}}}]}}\n\n'
        )

    def chunk(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        return sse(
            {
                "id": self._id,
                "object": self._object,
                "created": self._created,
                "model": self._fmt.model,
                "choices": choices,
                **extra,
            }
        )

    def running_usage(self, completion_tokens: int, index: int = 0) -> dict[str, Any]:
        # The prompt's cached tokens are only known at the end: not reported until then.
        per_choice = self._fmt.choice_prompt_tokens
        prompt_tokens = per_choice[index] if index < len(per_choice) else len(self._prompt)
        return usage(prompt_tokens, completion_tokens, 0, details=False)

    def roles(self, n: int, *, continuous: bool = False) -> str:
        # vLLM sends the prompt's token ids once, on the first chunk; with continuous usage
        # stats its role chunk carries usage too (0 completion tokens).
        extra: dict[str, Any] = {"prompt_token_ids": self._prompt} if self._fmt.return_token_ids else {}
        if continuous:
            extra["usage"] = self.running_usage(0)
        return self.chunk(
            [
                {
                    "index": i,
                    "delta": {"role": self._fmt.role, "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                for i in range(n)
            ],
            **extra,
        )

    def echo(self, n: int, *, continuous: bool = False) -> str:
        extra = {"usage": self.running_usage(0)} if continuous else {}
        return self.chunk(
            [
                {
                    "index": i,
                    "delta": {"content": self._fmt.echo_text},
                    "logprobs": None,
                    "finish_reason": None,
                }
                for i in range(n)
            ],
            **extra,
        )

    async def choice(self, event: SequenceEvent, token_text: TokenText) -> dict[str, Any]:
        top = self._fmt.top_logprobs
        if self._fmt.chat:
            logprobs = await chat_logprobs(event.logprobs, top, token_text) if event.logprobs else None
            delta, finish_reason = await self._tools.delta(
                event.index, event.text, event.finish_reason, list(event.token_ids)
            )
            return {
                "index": event.index,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": finish_reason,
                "stop_reason": event.stop_reason,
                **self._token_ids(event),
            }
        first = event.index not in self._started
        self._started.add(event.index)
        entries: list[common_pb2.TokenLogprob | int] = list(event.logprobs)
        if first and self._fmt.echo_text and event.prompt_logprobs is not None:
            # vLLM's echo with logprobs: the prompt's entries lead the first chunk's.
            entries = echo_entries(self._prompt, event.prompt_logprobs) + entries
        logprobs = None
        if entries:
            # Offsets run on through the choice's text, chunk after chunk, as vLLM's.
            offset = self._text_offsets.get(event.index, 0)
            logprobs = await completion_logprobs(entries, top, token_text, initial_offset=offset)
            self._text_offsets[event.index] = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])
        choice = {
            "index": event.index,
            "text": (self._fmt.echo_text if first else "") + event.text,
            "logprobs": logprobs,
            "finish_reason": event.finish_reason,
            "stop_reason": event.stop_reason,
            **self._token_ids(event),
        }
        if first and self._fmt.return_token_ids:
            choice["prompt_token_ids"] = self._prompt  # vLLM: on each choice's first chunk
        return choice

    def _token_ids(self, event: SequenceEvent) -> dict[str, Any]:
        return {"token_ids": list(event.token_ids)} if self._fmt.return_token_ids else {}
