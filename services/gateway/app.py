"""The OpenAI-compatible HTTP API: a thin FastAPI shell over libs/gateway."""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from dataclasses import dataclass
from typing import Any

import prometheus_client
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from cleave.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from libs.encoder.limits import ImageLimits
from libs.gateway import batch_chat, beam_search, errors, multi_prompt, responses, tokenize_api
from libs.gateway.cancellation import ClientDisconnected, gather_or_cancel, until_disconnected
from libs.gateway.edge import HttpEdge
from libs.gateway.extensions import bad_words_token_ids
from libs.gateway.images import encoded_images, image_cache_salt, image_files, image_files_salt
from libs.gateway.logprob_limits import apply_max_logprobs, engine_max_logprobs
from libs.gateway.openai_api import (
    INT32_MAX,
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
    chat_render,
    check_model,
    check_supported,
    completion_prompts,
    tokenizer_call,
    validation_error,
)
from libs.gateway.response_extras import chat_extras, token_id_labels
from libs.gateway.spec import generation_spec
from libs.gateway.streaming import StreamFormat, sse_events, started
from libs.gateway.tools import ToolCalling, tool_calling
from libs.gateway.vllm_fields import warn_unknown


@dataclass
class GatewayState:
    served_model: str
    max_model_len: int
    pipeline: Pipeline
    pool: WorkerPool
    tokenizer: tokenizer_pb2_grpc.TokenizerStub
    prompt_tokens_details: bool = False  # --enable-prompt-tokens-details
    force_include_usage: bool = False  # --enable-force-include-usage
    return_tokens_as_token_ids: bool = False  # --return-tokens-as-token-ids: the requests' default
    default_max_tokens: int | None = None  # GatewayParts.default_max_tokens
    enable_auto_tool_choice: bool = False  # --enable-auto-tool-choice (libs/gateway/tools.py)
    max_logprobs: int | None = None  # GatewayParts.max_logprobs (libs/gateway/logprob_limits.py)
    vocab_size: int | None = None  # GatewayParts.vocab_size: what a request's -1 logprobs ask for
    # The vision encoder (modes xEyPD / xEyPzD); None: a text-only server, image parts are 400s.
    encoder: Any = None  # an EncoderStub (or libs/gateway/images.py's round robin of them)
    # No encoder and a vision-language model: image files go to the workers, read with these
    # limits (the engine runs the vision tower). None (and no encoder): image parts are 400s.
    worker_images: ImageLimits | None = None

    def check_logprobs(self, body: ChatCompletionRequest | CompletionRequest) -> None:
        """The workers' --max-logprobs, before anything builds their contract."""
        vocab_size = self.vocab_size or INT32_MAX
        apply_max_logprobs(body, engine_max_logprobs(self.max_logprobs, vocab_size), vocab_size)


async def _with_images(
    state: GatewayState, body: ChatCompletionRequest, spec: GenerationSpec
) -> GenerationSpec:
    """The spec with the encoder's embeddings of the conversation's images (if any), and
    their content hashes in the cache salt (libs/gateway/images.py). Without an encoder but
    with a vision-language model: the image files, for the workers' engines to encode."""
    if state.encoder is None and state.worker_images is not None:
        files = await image_files(body, state.worker_images)
        if not files:
            return spec
        return dataclasses.replace(
            spec, images=tuple(files), cache_salt=image_files_salt(spec.cache_salt, files)
        )
    encoded = await encoded_images(state.encoder, body, spec.request_id)
    if not encoded:
        return spec
    return dataclasses.replace(
        spec,
        image_embeddings=tuple(e.embeddings for e in encoded),
        cache_salt=image_cache_salt(spec.cache_salt, encoded),
    )


async def _generator(
    state: GatewayState, body: ChatCompletionRequest | CompletionRequest, texts: responses.TokenizerTexts
) -> responses.Generate:
    """The pipeline, or (use_beam_search) beam search over the pipeline's one-token steps."""
    if not body.use_beam_search:
        return state.pipeline.run
    info = await state.tokenizer.GetInfo(tokenizer_pb2.GetInfoRequest())
    if not info.eos_token_ids:
        raise errors.invalid(
            "beam search needs the model's EOS token; its tokenizer names none", "use_beam_search"
        )
    # vLLM's beam search stops beams on the tokenizer's eos_token_id (the first listed).
    return beam_search.runner(state.pipeline.run, body.length_penalty, info.eos_token_ids[0], texts.text)


def create_app(state: GatewayState, edge: HttpEdge | None = None) -> FastAPI:
    edge = edge or HttpEdge()
    limits = edge.limits
    app = FastAPI(title="Cleave", docs_url=None, redoc_url=None, root_path=edge.root_path)
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
        state.check_logprobs(body)
        if body.stream:
            return await until_disconnected(request.receive, chat_stream(body))
        return await until_disconnected(request.receive, chat_whole(body))

    async def chat_stream(body: ChatCompletionRequest) -> StreamingResponse:
        prompt = await tokenizer_call(chat_prompt(state.tokenizer, body))
        top = body.top_logprobs or 0
        spec = _spec(state, edge, body, prompt, body.requested_max_tokens(), top if body.logprobs else None)
        spec = await _with_images(state, body, spec)
        await _bad_words(state, body, [spec])
        calling = tool_calling(body, state.tokenizer, auto_enabled=state.enable_auto_tool_choice)
        return await _stream(
            state, spec, chat=True, options=body.stream_options, top=top, tools=calling, body=body
        )

    async def chat_whole(body: ChatCompletionRequest) -> JSONResponse:
        return JSONResponse(await chat_object(body))

    async def chat_object(body: ChatCompletionRequest) -> dict[str, Any]:
        calling = tool_calling(body, state.tokenizer, auto_enabled=state.enable_auto_tool_choice)
        rendered = await tokenizer_call(chat_render(state.tokenizer, body))
        top_logprobs = (body.top_logprobs or 0) if body.logprobs else None
        spec = _spec(state, edge, body, list(rendered.token_ids), body.requested_max_tokens(), top_logprobs)
        spec = await _with_images(state, body, spec)
        await _bad_words(state, body, [spec])
        generation = await responses.collect(await _generator(state, body, texts), spec)
        return await responses.chat_completion(
            spec,
            generation,
            model=state.served_model,
            top_logprobs=top_logprobs,
            token_text=_token_text(state, body, texts),
            tools=calling,
            extras=chat_extras(body, spec.prompt_token_ids, rendered.prompt),
            prompt_texts=texts.token_texts,
        )

    @app.post("/v1/chat/completions/batch", response_model=None)
    async def chat_batch(request: Request) -> JSONResponse:
        """vLLM's batched chat completions (libs/gateway/batch_chat.py)."""
        request_id, bodies = batch_chat.split(await invocation_body(request))
        for body in bodies:
            check_model(body.model, state.served_model)
            check_supported(body)
            limits.check(body, state.max_model_len)
            state.check_logprobs(body)
        # The conversations run concurrently; one failing cancels the others.
        answers = gather_or_cancel(*(chat_object(body) for body in bodies))
        return JSONResponse(batch_chat.merge(request_id, await until_disconnected(request.receive, answers)))

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> JSONResponse | StreamingResponse:
        check_model(body.model, state.served_model)
        check_supported(body)
        limits.check(body, state.max_model_len)
        state.check_logprobs(body)
        if body.stream:
            return await until_disconnected(request.receive, completions_stream(body))
        return await until_disconnected(request.receive, completions_whole(body))

    async def completions_stream(body: CompletionRequest) -> StreamingResponse:
        specs = await completion_specs(body)
        if len(specs) == 1:
            return await _stream(
                state, specs[0], chat=False, options=body.stream_options, top=body.logprobs or 0, body=body
            )
        if body.echo or body.return_token_ids:
            # Both name one prompt per stream (its text, its ids) in Cleave's stream writer.
            raise errors.unsupported("streaming several prompts with echo or return_token_ids", "prompt")
        # vLLM's: all prompts at once in one stream, choice index = prompt x n + index.
        stream_spec = dataclasses.replace(specs[0], request_id=body.request_id or specs[0].request_id)
        return await _stream(
            state,
            stream_spec,
            chat=False,
            options=body.stream_options,
            top=body.logprobs or 0,
            body=body,
            generate=multi_prompt.merged(state.pipeline.run, specs),
            choice_prompt_tokens=multi_prompt.choice_prompt_tokens(specs),
        )

    async def completion_specs(body: CompletionRequest) -> list[GenerationSpec]:
        prompts = await tokenizer_call(completion_prompts(state.tokenizer, body))
        ids = _prompt_request_ids(body.request_id, len(prompts))
        specs = [
            _spec(state, edge, body, prompt, body.max_tokens, body.logprobs, request_id=request_id)
            for prompt, request_id in zip(prompts, ids, strict=True)
        ]
        await _bad_words(state, body, specs)
        return specs

    async def completions_whole(body: CompletionRequest) -> JSONResponse:
        specs = await completion_specs(body)
        # Several prompts run concurrently; one failing cancels the others.
        generate = await _generator(state, body, texts)
        generations = await gather_or_cancel(*(responses.collect(generate, spec) for spec in specs))
        return JSONResponse(
            await responses.text_completion(
                specs,
                generations,
                model=state.served_model,
                logprobs=body.logprobs,
                echo=body.echo,
                texts=texts,
                return_token_ids=bool(body.return_token_ids),
                token_text=_token_text(state, body, texts),
                response_id=body.request_id,
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
    *,
    request_id: str | None = None,
) -> GenerationSpec:
    request_id = request_id or body.request_id or uuid.uuid4().hex
    warn_unknown(body.model_extra, request_id)
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
        request_id=request_id,
    )


async def _stream_echo(state: GatewayState, spec: GenerationSpec, body: Any, *, chat: bool) -> dict[str, Any]:
    """A stream's reply role and echo, as vLLM's streaming serving sends them."""
    if body is None:
        return {}
    if chat:
        extras = chat_extras(body, spec.prompt_token_ids, "")
        return {"role": extras.role, "echo_text": extras.echo_text}
    if not body.echo:
        return {}
    return {"echo_text": await responses.TokenizerTexts(state.tokenizer).text(spec.prompt_token_ids)}


def _prompt_request_ids(request_id: str | None, prompts: int) -> list[str | None]:
    """The client's request id for one prompt; `<id>-<i>` for each of several (as vLLM)."""
    if request_id is None:
        return [None] * prompts
    return [request_id] if prompts == 1 else [f"{request_id}-{i}" for i in range(prompts)]


def _token_text(state: GatewayState, body: Any, texts: responses.TokenizerTexts) -> responses.TokenText:
    """How logprobs name tokens: `token_id:<id>` with return_tokens_as_token_ids, else text.
    A request that leaves it unset gets the server's --return-tokens-as-token-ids (vLLM's
    `return_as_token_id if not None else self.return_tokens_as_token_ids`)."""
    asked = body.return_tokens_as_token_ids
    as_ids = state.return_tokens_as_token_ids if asked is None else asked
    return token_id_labels if as_ids else texts.token_texts


async def _bad_words(state: GatewayState, body: Any, specs: list[GenerationSpec]) -> None:
    """vLLM's bad_words, tokenized here for the engines (which have no tokenizer)."""
    if not body.bad_words:
        return
    ids = await tokenizer_call(bad_words_token_ids(state.tokenizer, body.bad_words))
    for spec in specs:
        spec.sampling.bad_words_token_ids.extend(ids)


def _stream_options(options: StreamOptions | None, *, force_usage: bool) -> StreamOptions:
    """vLLM's should_include_usage: the server's force flag means usage at the end and on
    every chunk; otherwise what the request asked for."""
    if force_usage:
        return StreamOptions(include_usage=True, continuous_usage_stats=True)
    return options or StreamOptions()


async def _stream(
    state: GatewayState,
    spec: GenerationSpec,
    *,
    chat: bool,
    options: StreamOptions | None,
    top: int,
    tools: ToolCalling | None = None,
    body: Any = None,
    generate: responses.Generate | None = None,  # default: the pipeline
    choice_prompt_tokens: tuple[int, ...] = (),  # several prompts: each choice's prompt length
) -> StreamingResponse:
    # Failures before the first token get their own HTTP status, not an event in a 200 stream.
    began = time.perf_counter()
    generate = await started(generate or state.pipeline.run, spec)
    fmt = StreamFormat(
        chat=chat,
        model=state.served_model,
        options=_stream_options(options, force_usage=state.force_include_usage),
        top_logprobs=top,
        tools=tools,
        return_token_ids=bool(body is not None and body.return_token_ids),
        choice_prompt_tokens=choice_prompt_tokens,
        **(await _stream_echo(state, spec, body, chat=chat)),
    )
    texts = responses.TokenizerTexts(state.tokenizer)
    token_texts = _token_text(state, body, texts) if body is not None else texts.token_texts
    events = sse_events(generate, spec, fmt, token_texts, started_s=began)
    return StreamingResponse(events, media_type="text/event-stream")
