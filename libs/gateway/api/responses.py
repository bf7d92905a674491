"""Pipeline events -> whole OpenAI response objects (streamed chunks: libs/gateway/api/streaming.py)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cleave.common.v1 import common_pb2
from cleave.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from libs.gateway.api.latency import LatencyClock
from libs.gateway.api.response_extras import ChatExtras, echo_entries, prompt_logprobs
from libs.gateway.api.tools import ToolCalling
from libs.gateway.common import errors
from libs.gateway.common.errors import MidStreamError
from libs.gateway.common.generation import Finished, GenerationSpec, SequenceEvent
from libs.observability.logging import bound_request_id
from libs.tokenization.decoder import Decoder

TokenText = Callable[[Sequence[int]], Awaitable[dict[int, str]]]
# Pipeline.run, or a scripted stand-in in tests.
Generate = Callable[[GenerationSpec], AsyncIterator[SequenceEvent | Finished]]


@dataclass
class Choice:
    text: str = ""
    finish_reason: str | None = None
    logprobs: list[common_pb2.TokenLogprob] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    stop_reason: int | str | None = None  # vLLM's: the stop token id or string that ended it


@dataclass
class Generation:
    """One prompt's whole result: its n choices by index and the pipeline's final counts."""

    choices: dict[int, Choice]
    finished: Finished


class TokenizerTexts:
    """Text of token ids from the tokenizer service, for logprobs and echo."""

    def __init__(self, tokenizer: tokenizer_pb2_grpc.TokenizerStub, decoder: Decoder | None = None) -> None:
        self._tokenizer = tokenizer
        # The tokenizer's own decoder, when it handed it out (serving/local_detokenize.py):
        # texts are decoded here, not one tokenizer call per distinct token.
        self._decoder = decoder

    async def token_texts(self, ids: Sequence[int]) -> dict[int, str]:
        """Each token decoded on its own (a token's text in context may differ, e.g. a leading space)."""
        if self._decoder is not None:
            decode = self._decoder.decode
            return {token_id: decode([token_id]) for token_id in ids}
        texts = {}
        for token_id in ids:
            texts[token_id] = await self.text([token_id])
        return texts

    async def text(self, ids: Sequence[int]) -> str:
        if self._decoder is not None:
            return self._decoder.decode(ids)
        result = await self._tokenizer.Detokenize(tokenizer_pb2.DetokenizeRequest(token_ids=ids))
        return str(result.text)


def usage(prompt_tokens: int, completion_tokens: int, cached: int, *, details: bool) -> dict[str, Any]:
    """OpenAI's usage object. Cached prompt tokens only with `details` (vLLM's
    --enable-prompt-tokens-details, off by default): a hit count tells a client which
    prefixes others sent recently, unless every tenant salts its requests (cache_salt)."""
    body: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached and details:
        body["prompt_tokens_details"] = {"cached_tokens": cached}
    return body


async def chat_logprobs(
    entries: Sequence[common_pb2.TokenLogprob], top: int, token_text: TokenText
) -> dict[str, Any]:
    ids = {e.token_id for e in entries} | {t.token_id for e in entries for t in e.top}
    texts = await token_text(sorted(ids))

    def item(token_id: int, logprob: float) -> dict[str, Any]:
        text = texts.get(token_id, "")
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    content = []
    for entry in entries:
        content.append(
            {
                **item(entry.token_id, _clamped(entry.logprob)),
                "top_logprobs": [item(t, lp) for t, lp in _vllm_order(entry, top)[:top]],
            }
        )
    return {"content": content}


async def completion_logprobs(
    entries: Sequence[common_pb2.TokenLogprob | int],
    top: int,
    token_text: TokenText,
    *,
    initial_offset: int = 0,
) -> dict[str, Any]:
    """A bare id in `entries` is a token without logprobs (echo's first prompt token).
    `initial_offset`: where this chunk's text starts in the choice's (a stream's later chunks)."""
    logged = [e for e in entries if not isinstance(e, int)]
    ids = {_token_id(e) for e in entries} | {t.token_id for e in logged for t in e.top}
    texts = await token_text(sorted(ids))
    tokens = [texts.get(_token_id(e), "") for e in entries]
    offsets, position = [], initial_offset
    for token in tokens:
        offsets.append(position)
        position += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [None if isinstance(e, int) else _clamped(e.logprob) for e in entries],
        # The sampled token and the `top` best (vLLM keeps entries 0..top of its dict), so
        # logprobs=0 still gives the sampled token's, as vLLM's server does.
        "top_logprobs": [
            None if isinstance(e, int) else {texts.get(t, ""): lp for t, lp in _vllm_order(e, top)}
            for e in entries
        ],
        "text_offset": offsets,
    }


def _token_id(entry: common_pb2.TokenLogprob | int) -> int:
    return entry if isinstance(entry, int) else entry.token_id


def _vllm_order(entry: common_pb2.TokenLogprob, top: int) -> list[tuple[int, float]]:
    """(token id, logprob) as vLLM's per-position logprobs dict for `top` holds them, in the
    order its OpenAI server cuts them: the sampled token first, then the `top` best by rank
    (without the sampled one again)."""
    best = (t for t in entry.top if t.token_id != entry.token_id and t.rank <= top)
    others = sorted(best, key=lambda t: t.rank)
    return [(entry.token_id, _clamped(entry.logprob))] + [(t.token_id, _clamped(t.logprob)) for t in others]


def _clamped(logprob: float) -> float:
    # -inf is not JSON; OpenAI's API (and vLLM's server) uses -9999.0.
    return max(logprob, -9999.0)


async def collect(generate: Generate, spec: GenerationSpec) -> Generation:
    """Runs one spec to the end, joining each sequence's events into its choice."""
    choices: dict[int, Choice] = {i: Choice() for i in range(spec.sampling.n or 1)}
    clock = LatencyClock(spec, streamed=False)
    with bound_request_id(spec.request_id):
        try:
            async for event in generate(spec):
                if isinstance(event, SequenceEvent):
                    clock.token_event(event)
                    choice = choices[event.index]
                    choice.text += event.text
                    choice.logprobs.extend(event.logprobs)
                    choice.token_ids.extend(event.token_ids)
                    choice.stop_reason = (
                        event.stop_reason if event.stop_reason is not None else choice.stop_reason
                    )
                    choice.finish_reason = event.finish_reason or choice.finish_reason
                else:
                    clock.finished(event)
                    return Generation(choices, event)
        except MidStreamError as error:
            raise worker_failed(error) from error
    raise errors.ApiError(502, "generation ended without completing", type_="server_error")


def worker_failed(error: MidStreamError) -> errors.ApiError:
    """A worker failing after tokens were produced is a bad gateway, not a bad request."""
    return errors.ApiError(502, str(error), type_="server_error", code="worker_failed")


async def chat_completion(
    spec: GenerationSpec,
    generation: Generation,
    *,
    model: str,
    top_logprobs: int | None,
    token_text: TokenText,
    tools: ToolCalling | None = None,
    extras: ChatExtras | None = None,
    prompt_texts: TokenText | None = None,
    response_id: str | None = None,
) -> dict[str, Any]:
    """The chat.completion object; top_logprobs is None when the request asked for no logprobs.
    `response_id`: the client's request id (the spec's is the internal one: request_ids.py).
    `tools`: the request's tool calls taken out of the text (libs/gateway/api/tools.py).
    `extras`: vLLM's options' additions (response_extras.py); `prompt_texts` decodes the
    prompt logprobs' tokens (their decoded_token is text even when token_text gives ids)."""
    extras = extras or ChatExtras()
    choices = []
    for index, choice in sorted(generation.choices.items()):
        logprobs = None
        if top_logprobs is not None:
            logprobs = await chat_logprobs(choice.logprobs, top_logprobs, token_text)
        message, finish_reason = await (tools or ToolCalling()).message(choice.text, choice.finish_reason)
        choices.append(
            {
                "index": index,
                "message": extras.message(message),
                "logprobs": logprobs,
                "finish_reason": finish_reason,
                "stop_reason": choice.stop_reason,
                "token_ids": choice.token_ids if extras.return_token_ids else None,
            }
        )
    finished = generation.finished
    body: dict[str, Any] = {
        "id": f"chatcmpl-{response_id or spec.request_id}",
        "object": "chat.completion",
        "created": now(),
        "model": model,
        "choices": choices,
        # vLLM's response model dumps every field, unset ones as null; clients read them.
        "service_tier": None,
        "system_fingerprint": None,
        "prompt_logprobs": None,
        "usage": usage(
            finished.prompt_tokens,
            finished.completion_tokens,
            finished.cached_prompt_tokens,
            details=spec.prompt_tokens_details,
        ),
        **extras.top_level(),
    }
    if finished.prompt_logprobs is not None:
        body["prompt_logprobs"] = await prompt_logprobs(
            spec.prompt_token_ids, finished.prompt_logprobs, prompt_texts or token_text
        )
    return body


async def text_completion(
    specs: Sequence[GenerationSpec],
    generations: Sequence[Generation],
    *,
    model: str,
    logprobs: int | None,
    echo: bool,
    texts: TokenizerTexts,
    return_token_ids: bool = False,
    token_text: TokenText | None = None,
    response_id: str | None = None,
) -> dict[str, Any]:
    """The text_completion object over one generation per prompt.

    As in OpenAI's API, prompt i's n choices get indices i*n .. i*n+n-1 and usage is the
    sum over prompts. vLLM's additions: with echo and logprobs, the prompt's tokens lead the
    logprobs (the first with none); `prompt_logprobs` per choice when asked for; token ids
    with `return_token_ids`; `token_text` names tokens in logprobs (default: their text).
    """
    token_text = token_text or texts.token_texts
    n = specs[0].sampling.n or 1
    choices = []
    for prompt_index, (spec, generation) in enumerate(zip(specs, generations, strict=True)):
        prompt = spec.prompt_token_ids
        prefix = await texts.text(prompt) if echo else ""
        entries = generation.finished.prompt_logprobs
        shown_prompt_logprobs = (
            await prompt_logprobs(prompt, entries, texts.token_texts) if entries is not None else None
        )
        for index, choice in sorted(generation.choices.items()):
            choice_logprobs = None
            if logprobs is not None:
                lead = echo_entries(prompt, entries or []) if echo else []
                choice_logprobs = await completion_logprobs([*lead, *choice.logprobs], logprobs, token_text)
            choices.append(
                {
                    "index": prompt_index * n + index,
                    "text": prefix + choice.text,
                    "logprobs": choice_logprobs,
                    "finish_reason": choice.finish_reason,
                    "stop_reason": choice.stop_reason,
                    "prompt_logprobs": shown_prompt_logprobs,
                    "prompt_token_ids": list(prompt) if return_token_ids else None,
                    "token_ids": choice.token_ids if return_token_ids else None,
                }
            )
    finished = [g.finished for g in generations]
    return {
        "id": f"cmpl-{response_id or specs[0].request_id}",
        "object": "text_completion",
        "created": now(),
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage(
            sum(f.prompt_tokens for f in finished),
            sum(f.completion_tokens for f in finished),
            sum(f.cached_prompt_tokens for f in finished),
            details=specs[0].prompt_tokens_details,
        ),
    }


def sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


def now() -> int:
    return int(time.time())
