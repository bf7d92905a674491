"""The OpenAI-compatible HTTP API: a thin FastAPI shell over libs/gateway."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc.aio
import prometheus_client
import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from cleave.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from libs.gateway import errors, metrics, responses
from libs.gateway.openai_api import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    StreamOptions,
    TokenizeRequest,
)
from libs.gateway.pipeline import Finished, GenerationSpec, MidStreamError, Pipeline, SequenceEvent
from libs.gateway.pool import WorkerPool
from libs.gateway.requests import chat_prompt, check_supported, completion_prompts, sampling_params
from libs.observability.logging import bound_request_id

log = structlog.get_logger(__name__)


@dataclass
class GatewayState:
    served_model: str
    max_model_len: int
    pipeline: Pipeline
    pool: WorkerPool
    tokenizer: tokenizer_pb2_grpc.TokenizerStub


def create_app(state: GatewayState) -> FastAPI:
    app = FastAPI(title="Cleave", docs_url=None, redoc_url=None)

    @app.exception_handler(errors.ApiError)
    async def api_error(_request: Request, error: errors.ApiError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {"msg": "invalid request", "loc": ()}
        location = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"{location}: {first['msg']}" if location else str(first["msg"])
        return JSONResponse(errors.invalid(message, location or None).body(), status_code=400)

    @app.get("/health")
    async def health() -> JSONResponse:
        ready = bool(state.pool.healthy("decode") or state.pool.healthy("both"))
        body = {"status": "ok" if ready else "unavailable", "workers": _worker_health(state)}
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(prometheus_client.generate_latest(), media_type=prometheus_client.CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": state.served_model,
                    "object": "model",
                    "created": 0,
                    "owned_by": "cleave",
                    "max_model_len": state.max_model_len,
                }
            ],
        }

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        _check_model(state, body.model)
        if body.messages is not None:
            ids = await chat_prompt(
                state.tokenizer, ChatCompletionRequest(model=state.served_model, messages=body.messages)
            )
            return {"tokens": ids, "count": len(ids), "max_model_len": state.max_model_len}
        if body.prompt is None:
            raise errors.invalid("either prompt or messages is required", "prompt")
        result = await state.tokenizer.Tokenize(
            tokenizer_pb2.TokenizeRequest(
                text=body.prompt,
                add_special_tokens=body.add_special_tokens,
                return_token_strs=body.return_token_strs,
            )
        )
        reply: dict[str, Any] = {
            "tokens": list(result.token_ids),
            "count": len(result.token_ids),
            "max_model_len": state.max_model_len,
        }
        if body.return_token_strs:
            reply["token_strs"] = list(result.token_strs)
        return reply

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        _check_model(state, body.model)
        try:
            result = await state.tokenizer.Detokenize(tokenizer_pb2.DetokenizeRequest(token_ids=body.tokens))
        except grpc.aio.AioRpcError as error:
            raise errors.invalid(error.details() or "invalid tokens", "tokens") from error
        return {"prompt": result.text}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatCompletionRequest) -> JSONResponse | StreamingResponse:
        _check_model(state, body.model)
        check_supported(body)
        prompt = await _call_tokenizer(chat_prompt(state.tokenizer, body))
        top = body.top_logprobs or 0
        spec = _spec(state, body, prompt, body.requested_max_tokens(), top if body.logprobs else None)
        if body.stream:
            return _stream(
                state,
                spec,
                chat=True,
                options=body.stream_options or StreamOptions(),
                top=top,
            )
        choices, finished = await _collect(state, spec)
        out = []
        for index, choice in sorted(choices.items()):
            item: dict[str, Any] = {
                "index": index,
                "message": {"role": "assistant", "content": choice.text},
                "logprobs": await responses.chat_logprobs(choice.logprobs, top, _token_text(state))
                if body.logprobs
                else None,
                "finish_reason": choice.finish_reason,
            }
            out.append(item)
        return JSONResponse(
            {
                "id": f"chatcmpl-{spec.request_id}",
                "object": "chat.completion",
                "created": responses.now(),
                "model": state.served_model,
                "choices": out,
                "usage": responses.usage(
                    finished.prompt_tokens, finished.completion_tokens, finished.cached_prompt_tokens
                ),
            }
        )

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest) -> JSONResponse | StreamingResponse:
        _check_model(state, body.model)
        check_supported(body)
        prompts = await _call_tokenizer(completion_prompts(state.tokenizer, body))
        specs = [_spec(state, body, prompt, body.max_tokens, body.logprobs) for prompt in prompts]
        if body.stream:
            if len(specs) != 1:
                raise errors.unsupported("streaming a list of several prompts", "prompt")
            return _stream(
                state,
                specs[0],
                chat=False,
                options=body.stream_options or StreamOptions(),
                top=body.logprobs or 0,
            )
        # Several prompts run concurrently; as in OpenAI's API, prompt i's n choices get
        # indices i*n .. i*n+n-1 and usage is the sum over prompts.
        results = await asyncio.gather(*(_collect(state, spec) for spec in specs))
        n = specs[0].sampling.n or 1
        out = []
        for prompt_index, (prompt, (choices, _finished)) in enumerate(zip(prompts, results, strict=True)):
            echo = ""
            if body.echo:
                request = tokenizer_pb2.DetokenizeRequest(token_ids=prompt)
                echo = (await state.tokenizer.Detokenize(request)).text
            for index, choice in sorted(choices.items()):
                logprobs = None
                if body.logprobs is not None:
                    logprobs = await responses.completion_logprobs(
                        choice.logprobs, body.logprobs, _token_text(state)
                    )
                out.append(
                    {
                        "index": prompt_index * n + index,
                        "text": echo + choice.text,
                        "logprobs": logprobs,
                        "finish_reason": choice.finish_reason,
                    }
                )
        finished = [f for _choices, f in results]
        return JSONResponse(
            {
                "id": f"cmpl-{specs[0].request_id}",
                "object": "text_completion",
                "created": responses.now(),
                "model": state.served_model,
                "choices": out,
                "usage": responses.usage(
                    sum(f.prompt_tokens for f in finished),
                    sum(f.completion_tokens for f in finished),
                    sum(f.cached_prompt_tokens for f in finished),
                ),
            }
        )

    return app


def _check_model(state: GatewayState, model: str | None) -> None:
    if model is not None and model != state.served_model:
        raise errors.model_not_found(model, state.served_model)


async def _call_tokenizer(call: Any) -> Any:
    try:
        return await call
    except grpc.aio.AioRpcError as error:
        if error.code() == grpc.StatusCode.INVALID_ARGUMENT:
            raise errors.invalid(error.details() or "invalid input") from error
        raise errors.ApiError(
            503, f"tokenizer unavailable: {error.code().name}", type_="service_unavailable"
        ) from error


def _spec(
    state: GatewayState, body: Any, prompt: list[int], max_tokens: int | None, logprobs: int | None
) -> GenerationSpec:
    if not prompt:
        raise errors.invalid("prompt is empty", "prompt")
    if max_tokens is None:
        max_tokens = max(1, state.max_model_len - len(prompt))
    if len(prompt) + max_tokens > state.max_model_len:
        raise errors.context_too_long(len(prompt), max_tokens, state.max_model_len)
    metrics.PROMPT_TOKENS.observe(len(prompt))
    return GenerationSpec(
        request_id=uuid.uuid4().hex,
        model=state.served_model,
        prompt_token_ids=prompt,
        sampling=sampling_params(body, max_tokens=max_tokens, logprobs=logprobs),
        stops=body.stops(),
    )


async def _collect(state: GatewayState, spec: GenerationSpec) -> tuple[dict[int, responses.Choice], Finished]:
    choices: dict[int, responses.Choice] = {i: responses.Choice() for i in range(spec.sampling.n or 1)}
    started = time.perf_counter()
    with bound_request_id(spec.request_id):
        try:
            async for event in state.pipeline.run(spec):
                if isinstance(event, SequenceEvent):
                    choice = choices[event.index]
                    choice.text += event.text
                    choice.logprobs.extend(event.logprobs)
                    choice.finish_reason = event.finish_reason or choice.finish_reason
                else:
                    metrics.E2E_SECONDS.observe(time.perf_counter() - started)
                    metrics.COMPLETION_TOKENS.observe(event.completion_tokens)
                    return choices, event
        except MidStreamError as error:
            raise errors.ApiError(502, str(error), type_="server_error", code="worker_failed") from error
    raise errors.ApiError(502, "generation ended without completing", type_="server_error")


def _stream(
    state: GatewayState, spec: GenerationSpec, *, chat: bool, options: StreamOptions, top: int
) -> StreamingResponse:
    kind = "chat.completion.chunk" if chat else "text_completion"
    prefix = "chatcmpl" if chat else "cmpl"

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        return responses.sse(
            {
                "id": f"{prefix}-{spec.request_id}",
                "object": kind,
                "created": responses.now(),
                "model": state.served_model,
                "choices": choices,
                **extra,
            }
        )

    async def events() -> AsyncIterator[str]:
        started = time.perf_counter()
        last = started
        first = True
        completion_tokens = 0
        with bound_request_id(spec.request_id):
            try:
                if chat:
                    yield chunk(
                        [
                            {
                                "index": i,
                                "delta": {"role": "assistant", "content": ""},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                            for i in range(spec.sampling.n or 1)
                        ]
                    )
                async for event in state.pipeline.run(spec):
                    if isinstance(event, Finished):
                        if options.include_usage:
                            yield chunk(
                                [],
                                usage=responses.usage(
                                    event.prompt_tokens, event.completion_tokens, event.cached_prompt_tokens
                                ),
                            )
                        break
                    now = time.perf_counter()
                    if first:
                        metrics.TTFT_SECONDS.observe(now - started)
                        first = False
                    else:
                        metrics.ITL_SECONDS.observe(now - last)
                    last = now
                    if chat:
                        logprobs = (
                            await responses.chat_logprobs(event.logprobs, top, _token_text(state))
                            if event.logprobs
                            else None
                        )
                        choice = {
                            "index": event.index,
                            "delta": {"content": event.text} if event.text else {},
                            "logprobs": logprobs,
                            "finish_reason": event.finish_reason,
                        }
                    else:
                        logprobs = (
                            await responses.completion_logprobs(event.logprobs, top, _token_text(state))
                            if event.logprobs
                            else None
                        )
                        choice = {
                            "index": event.index,
                            "text": event.text,
                            "logprobs": logprobs,
                            "finish_reason": event.finish_reason,
                        }
                    completion_tokens += len(event.token_ids)
                    if options.continuous_usage_stats:
                        usage = responses.usage(len(spec.prompt_token_ids), completion_tokens, 0)
                        yield chunk([choice], usage=usage)
                    else:
                        yield chunk([choice])
            except (errors.ApiError, MidStreamError) as error:
                body = (
                    error.body()
                    if isinstance(error, errors.ApiError)
                    else errors.ApiError(502, str(error), type_="server_error", code="worker_failed").body()
                )
                log.warning("stream failed", error=body["error"]["message"])
                yield responses.sse(body)
            yield responses.sse("[DONE]")

    return StreamingResponse(events(), media_type="text/event-stream")


def _token_text(state: GatewayState) -> responses.TokenText:
    async def token_text(ids: Sequence[int]) -> dict[int, str]:
        texts = {}
        for token_id in ids:
            result = await state.tokenizer.Detokenize(tokenizer_pb2.DetokenizeRequest(token_ids=[token_id]))
            texts[token_id] = result.text
        return texts

    return token_text


def _worker_health(state: GatewayState) -> list[dict[str, Any]]:
    return [
        {
            "address": e.address,
            "role": e.role,
            "healthy": e.healthy,
            "running": e.stats.num_running,
            "kv_cache_usage": round(e.stats.kv_cache_usage, 4),
        }
        for e in state.pool.endpoints
    ]
