"""Pipeline events -> whole OpenAI response objects (streamed chunks: libs/gateway/streaming.py)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from cleave.common.v1 import common_pb2
from cleave.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from libs.gateway import errors, metrics
from libs.gateway.pipeline import Finished, GenerationSpec, MidStreamError, SequenceEvent
from libs.gateway.pool import Endpoint
from libs.observability.logging import bound_request_id

TokenText = Callable[[Sequence[int]], Awaitable[dict[int, str]]]
# Pipeline.run, or a scripted stand-in in tests.
Generate = Callable[[GenerationSpec], AsyncIterator[SequenceEvent | Finished]]


@dataclass
class Choice:
    text: str = ""
    finish_reason: str | None = None
    logprobs: list[common_pb2.TokenLogprob] = field(default_factory=list)


@dataclass
class Generation:
    """One prompt's whole result: its n choices by index and the pipeline's final counts."""

    choices: dict[int, Choice]
    finished: Finished


class TokenizerTexts:
    """Text of token ids from the tokenizer service, for logprobs and echo."""

    def __init__(self, tokenizer: tokenizer_pb2_grpc.TokenizerStub) -> None:
        self._tokenizer = tokenizer

    async def token_texts(self, ids: Sequence[int]) -> dict[int, str]:
        """Each token decoded on its own (a token's text in context may differ, e.g. a leading space)."""
        texts = {}
        for token_id in ids:
            texts[token_id] = await self.text([token_id])
        return texts

    async def text(self, ids: Sequence[int]) -> str:
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
    entries: Sequence[common_pb2.TokenLogprob], top: int, token_text: TokenText
) -> dict[str, Any]:
    ids = {e.token_id for e in entries} | {t.token_id for e in entries for t in e.top}
    texts = await token_text(sorted(ids))
    tokens = [texts.get(e.token_id, "") for e in entries]
    offsets, position = [], 0
    for token in tokens:
        offsets.append(position)
        position += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [_clamped(e.logprob) for e in entries],
        # The sampled token and the `top` best (vLLM keeps entries 0..top of its dict), so
        # logprobs=0 still gives the sampled token's, as vLLM's server does.
        "top_logprobs": [{texts.get(t, ""): lp for t, lp in _vllm_order(e, top)} for e in entries],
        "text_offset": offsets,
    }


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
    started = time.perf_counter()
    with bound_request_id(spec.request_id):
        try:
            async for event in generate(spec):
                if isinstance(event, SequenceEvent):
                    choice = choices[event.index]
                    choice.text += event.text
                    choice.logprobs.extend(event.logprobs)
                    choice.finish_reason = event.finish_reason or choice.finish_reason
                else:
                    metrics.E2E_SECONDS.observe(time.perf_counter() - started)
                    metrics.COMPLETION_TOKENS.observe(event.completion_tokens)
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
) -> dict[str, Any]:
    """The chat.completion object; top_logprobs is None when the request asked for no logprobs."""
    choices = []
    for index, choice in sorted(generation.choices.items()):
        logprobs = None
        if top_logprobs is not None:
            logprobs = await chat_logprobs(choice.logprobs, top_logprobs, token_text)
        choices.append(
            {
                "index": index,
                "message": {"role": "assistant", "content": choice.text},
                "logprobs": logprobs,
                "finish_reason": choice.finish_reason,
            }
        )
    finished = generation.finished
    return {
        "id": f"chatcmpl-{spec.request_id}",
        "object": "chat.completion",
        "created": now(),
        "model": model,
        "choices": choices,
        "usage": usage(
            finished.prompt_tokens,
            finished.completion_tokens,
            finished.cached_prompt_tokens,
            details=spec.prompt_tokens_details,
        ),
    }


async def text_completion(
    specs: Sequence[GenerationSpec],
    generations: Sequence[Generation],
    *,
    model: str,
    logprobs: int | None,
    echo: bool,
    texts: TokenizerTexts,
) -> dict[str, Any]:
    """The text_completion object over one generation per prompt.

    As in OpenAI's API, prompt i's n choices get indices i*n .. i*n+n-1 and usage is the
    sum over prompts.
    """
    n = specs[0].sampling.n or 1
    choices = []
    for prompt_index, (spec, generation) in enumerate(zip(specs, generations, strict=True)):
        prefix = await texts.text(spec.prompt_token_ids) if echo else ""
        for index, choice in sorted(generation.choices.items()):
            choice_logprobs = None
            if logprobs is not None:
                choice_logprobs = await completion_logprobs(choice.logprobs, logprobs, texts.token_texts)
            choices.append(
                {
                    "index": prompt_index * n + index,
                    "text": prefix + choice.text,
                    "logprobs": choice_logprobs,
                    "finish_reason": choice.finish_reason,
                }
            )
    finished = [g.finished for g in generations]
    return {
        "id": f"cmpl-{specs[0].request_id}",
        "object": "text_completion",
        "created": now(),
        "model": model,
        "choices": choices,
        "usage": usage(
            sum(f.prompt_tokens for f in finished),
            sum(f.completion_tokens for f in finished),
            sum(f.cached_prompt_tokens for f in finished),
            details=specs[0].prompt_tokens_details,
        ),
    }


def models(served_model: str, max_model_len: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": served_model,
                "object": "model",
                "created": 0,
                "owned_by": "cleave",
                "max_model_len": max_model_len,
            }
        ],
    }


def version(endpoints: Sequence[Endpoint]) -> dict[str, Any]:
    """vLLM's /version: the engine's vLLM version, as the workers report it ("vllm 0.x.y cpu");
    clients written for vLLM's server use it to tell which parameters they may send."""
    for endpoint in endpoints:
        engine = endpoint.info.engine_version.split() if endpoint.info is not None else []
        if len(engine) >= 2 and engine[0] == "vllm":
            return {"version": engine[1]}
    return {"version": "unknown"}


async def tokenizer_status(
    tokenizer: tokenizer_pb2_grpc.TokenizerStub, timeout_s: float = 2.0
) -> dict[str, Any]:
    """Whether the tokenizer service answers (its GetInfo, with a short deadline)."""
    try:
        await tokenizer.GetInfo(tokenizer_pb2.GetInfoRequest(), timeout=timeout_s)
    except grpc.aio.AioRpcError as error:
        return {"reachable": False, "error": error.code().name}
    return {"reachable": True}


def not_ready_reason(endpoints: Sequence[Endpoint], tokenizer: dict[str, Any]) -> str | None:
    """Why a request cannot be served now, or None. The pipeline's own choice: with a healthy
    decode worker it prefills on a prefill worker; with none, a colocated worker does both."""
    if not tokenizer["reachable"]:
        return f"the tokenizer service does not answer ({tokenizer.get('error', 'unknown')})"
    healthy = {e.role for e in endpoints if e.healthy}
    if "decode" in healthy:
        return None if "prefill" in healthy else "no healthy prefill worker for the decode workers"
    return None if "both" in healthy else "no healthy decode or colocated worker"


def health(endpoints: Sequence[Endpoint], tokenizer: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The /health body (liveness: 200 while the gateway answers): every service's state,
    with status "ok" when a request can be served now, else "degraded" (see /ready)."""
    workers = [
        {
            "address": e.address,
            "role": e.role,
            "healthy": e.healthy,
            "running": e.stats.num_running,
            "kv_cache_usage": round(e.stats.kv_cache_usage, 4),
        }
        for e in endpoints
    ]
    status = "degraded" if not_ready_reason(endpoints, tokenizer) else "ok"
    return {"status": status, "tokenizer": tokenizer, "workers": workers}, 200


def ready(endpoints: Sequence[Endpoint], tokenizer: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The /ready body: 200 when the tokenizer answers and every role a request needs has a
    healthy worker, else 503 with the reason."""
    reason = not_ready_reason(endpoints, tokenizer)
    if reason is None:
        return {"ready": True}, 200
    return {"ready": False, "reason": reason}, 503


def sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


def now() -> int:
    return int(time.time())
