"""The OpenAI-compatible HTTP API: a thin FastAPI shell over libs/gateway."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import prometheus_client
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from cleave.tokenizer.v1 import tokenizer_pb2_grpc
from libs.gateway import errors, responses, tokenize_api
from libs.gateway.cancellation import ClientDisconnected, gather_or_cancel, until_disconnected
from libs.gateway.edge import HttpEdge
from libs.gateway.openai_api import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    StreamOptions,
    TokenizeRequest,
)
from libs.gateway.pipeline import GenerationSpec, Pipeline
from libs.gateway.pool import WorkerPool
from libs.gateway.request_metrics import RequestCounter
from libs.gateway.requests import (
    chat_prompt,
    check_model,
    check_supported,
    completion_prompts,
    tokenizer_call,
    validation_error,
)
from libs.gateway.spec import generation_spec
from libs.gateway.streaming import StreamFormat, sse_events, started


@dataclass
class GatewayState:
    served_model: str
    max_model_len: int
    pipeline: Pipeline
    pool: WorkerPool
    tokenizer: tokenizer_pb2_grpc.TokenizerStub
    prompt_tokens_details: bool = False  # --enable-prompt-tokens-details
    default_max_tokens: int | None = None  # GatewayParts.default_max_tokens


def create_app(state: GatewayState, edge: HttpEdge | None = None) -> FastAPI:
    edge = edge or HttpEdge()
    limits = edge.limits
    app = FastAPI(title="Cleave", docs_url=None, redoc_url=None)
    texts = responses.TokenizerTexts(state.tokenizer)

    @app.exception_handler(errors.ApiError)
    async def api_error(_request: Request, error: errors.ApiError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    @app.exception_handler(HTTPException)
    async def framework_error(_request: Request, error: HTTPException) -> JSONResponse:
        # An unparsable body (invalid UTF-8, nesting too deep), an unknown path or method.
        api_error = errors.framework_error(error.status_code, str(error.detail))
        return JSONResponse(api_error.body(), status_code=api_error.status, headers=error.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_request: Request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse(validation_error(error.errors()).body(), status_code=400)

    @app.exception_handler(ClientDisconnected)
    async def client_gone(_request: Request, _error: ClientDisconnected) -> Response:
        # Nobody reads it; 499 (nginx's "client closed request") is what the metrics count.
        return Response(status_code=499)

    @app.get("/health")
    async def health() -> JSONResponse:
        body, status = responses.health(
            state.pool.endpoints, await responses.tokenizer_status(state.tokenizer)
        )
        return JSONResponse(body, status_code=status)

    @app.get("/ready")
    async def ready() -> JSONResponse:
        body, status = responses.ready(
            state.pool.endpoints, await responses.tokenizer_status(state.tokenizer)
        )
        return JSONResponse(body, status_code=status)

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(prometheus_client.generate_latest(), media_type=prometheus_client.CONTENT_TYPE_LATEST)

    @app.get("/version")
    async def version() -> dict[str, Any]:
        return responses.version(state.pool.endpoints)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return responses.models(state.served_model, state.max_model_len)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        check_model(body.model, state.served_model)
        limits.check_tokenize(body, state.max_model_len)
        return await tokenize_api.tokenize(
            state.tokenizer, body, model=state.served_model, max_model_len=state.max_model_len
        )

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        check_model(body.model, state.served_model)
        return await tokenize_api.detokenize(state.tokenizer, body)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatCompletionRequest, request: Request) -> JSONResponse | StreamingResponse:
        check_model(body.model, state.served_model)
        check_supported(body)
        limits.check(body, state.max_model_len)
        if body.stream:
            return await until_disconnected(request.receive, chat_stream(body))
        return await until_disconnected(request.receive, chat_whole(body))

    async def chat_stream(body: ChatCompletionRequest) -> StreamingResponse:
        prompt = await tokenizer_call(chat_prompt(state.tokenizer, body))
        top = body.top_logprobs or 0
        spec = _spec(state, edge, body, prompt, body.requested_max_tokens(), top if body.logprobs else None)
        return await _stream(state, spec, chat=True, options=body.stream_options, top=top)

    async def chat_whole(body: ChatCompletionRequest) -> JSONResponse:
        prompt = await tokenizer_call(chat_prompt(state.tokenizer, body))
        top_logprobs = (body.top_logprobs or 0) if body.logprobs else None
        spec = _spec(state, edge, body, prompt, body.requested_max_tokens(), top_logprobs)
        generation = await responses.collect(state.pipeline.run, spec)
        return JSONResponse(
            await responses.chat_completion(
                spec,
                generation,
                model=state.served_model,
                top_logprobs=top_logprobs,
                token_text=texts.token_texts,
            )
        )

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> JSONResponse | StreamingResponse:
        check_model(body.model, state.served_model)
        check_supported(body)
        limits.check(body, state.max_model_len)
        if body.stream:
            return await until_disconnected(request.receive, completions_stream(body))
        return await until_disconnected(request.receive, completions_whole(body))

    async def completions_stream(body: CompletionRequest) -> StreamingResponse:
        specs = await completion_specs(body)
        if len(specs) != 1:
            raise errors.unsupported("streaming a list of several prompts", "prompt")
        return await _stream(state, specs[0], chat=False, options=body.stream_options, top=body.logprobs or 0)

    async def completion_specs(body: CompletionRequest) -> list[GenerationSpec]:
        prompts = await tokenizer_call(completion_prompts(state.tokenizer, body))
        return [_spec(state, edge, body, prompt, body.max_tokens, body.logprobs) for prompt in prompts]

    async def completions_whole(body: CompletionRequest) -> JSONResponse:
        specs = await completion_specs(body)
        # Several prompts run concurrently; one failing cancels the others.
        generations = await gather_or_cancel(*(responses.collect(state.pipeline.run, spec) for spec in specs))
        return JSONResponse(
            await responses.text_completion(
                specs,
                generations,
                model=state.served_model,
                logprobs=body.logprobs,
                echo=body.echo,
                texts=texts,
            )
        )

    @app.post("/invocations", response_model=None)
    async def invocations(request: Request) -> JSONResponse | StreamingResponse:
        """SageMaker's entry point, as vLLM serves it: the body goes to the first endpoint
        whose request type it validates as (chat completions, then completions)."""
        body = await invocation_body(request)
        with contextlib.suppress(ValidationError):
            return await chat(ChatCompletionRequest.model_validate(body), request)
        with contextlib.suppress(ValidationError):
            return await completions(CompletionRequest.model_validate(body), request)
        raise errors.invalid(
            "Cannot find suitable handler for request. Expected one of: "
            "['ChatCompletionRequest', 'CompletionRequest']"
        )

    @app.api_route("/ping", methods=["GET", "POST"])
    async def ping() -> JSONResponse:
        """SageMaker's health check: the same answer as /health."""
        return await health()

    edge.install(app)
    # Outermost: counts the edge's refusals (401, 413) too.
    app.add_middleware(RequestCounter, endpoints={getattr(route, "path", "") for route in app.routes})
    return app


async def invocation_body(request: Request) -> Any:
    try:
        return await request.json()
    except ValueError as error:  # not JSON, or not UTF-8
        raise errors.invalid(f"the body is not valid JSON: {error}") from error


def _spec(
    state: GatewayState,
    edge: HttpEdge,
    body: Any,
    prompt: list[int],
    max_tokens: int | None,
    logprobs: int | None,
) -> GenerationSpec:
    return generation_spec(
        body,
        prompt,
        model=state.served_model,
        max_model_len=state.max_model_len,
        max_tokens=max_tokens,
        logprobs=logprobs,
        max_tokens_cap=edge.limits.max_tokens_cap,
        default_max_tokens=state.default_max_tokens,
        prompt_tokens_details=state.prompt_tokens_details,
    )


async def _stream(
    state: GatewayState, spec: GenerationSpec, *, chat: bool, options: StreamOptions | None, top: int
) -> StreamingResponse:
    # Failures before the first token get their own HTTP status, not an event in a 200 stream.
    began = time.perf_counter()
    generate = await started(state.pipeline.run, spec)
    fmt = StreamFormat(
        chat=chat, model=state.served_model, options=options or StreamOptions(), top_logprobs=top
    )
    token_texts = responses.TokenizerTexts(state.tokenizer).token_texts
    events = sse_events(generate, spec, fmt, token_texts, started_s=began)
    return StreamingResponse(events, media_type="text/event-stream")
