"""The OpenAI-compatible HTTP API: routes and error handlers over the edge's handlers
(completions.py for generation, tokenize_api.py, health.py)."""

from __future__ import annotations

import contextlib
from typing import Any

import prometheus_client
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from libs.gateway.api import health as health_api
from libs.gateway.api import metrics_export, request_ids, tokenize_api
from libs.gateway.api.adapters import LoadLoraAdapterRequest, UnloadLoraAdapterRequest
from libs.gateway.api.cancellation import ClientDisconnected
from libs.gateway.api.completions import Completions, invocation_body
from libs.gateway.api.context import ApiContext
from libs.gateway.api.http.edge import HttpEdge
from libs.gateway.api.http.request_metrics import RequestCounter
from libs.gateway.api.openai_api import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from libs.gateway.api.requests import validation_error
from libs.gateway.common import errors
from libs.gateway.fleet.worker_metrics import WorkerStatsCollector


def create_app(context: ApiContext, edge: HttpEdge | None = None) -> FastAPI:
    edge = edge or HttpEdge()
    app = FastAPI(title="Cleave", docs_url=None, redoc_url=None, root_path=edge.root_path)
    handlers = Completions(context, edge)
    _error_handlers(app)

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        # Open to probes, no I/O (liveness); the workers' addresses only for a caller the API
        # keys let in.
        tokenizer = context.tokenizer_health.status()
        addresses = edge.authenticated(request.scope.get("headers", ()))
        body, status = health_api.health(context.workers.endpoints, tokenizer, addresses=addresses)
        return JSONResponse(body, status_code=status)

    @app.get("/ready")
    async def ready() -> JSONResponse:
        tokenizer = context.tokenizer_health.status()
        body, status = health_api.ready(context.workers.endpoints, tokenizer, context.model)
        return JSONResponse(body, status_code=status)

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        text = metrics_export.latest([WorkerStatsCollector(context.workers)])
        return Response(text, media_type=prometheus_client.CONTENT_TYPE_LATEST)

    @app.get("/version")
    async def version() -> dict[str, Any]:
        return health_api.version(context.workers.endpoints)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return health_api.models(context.model, context.adapters.cards(context.model.model))

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        facts = context.model
        context.adapters.resolve(body.model, facts.model)  # an adapter tokenizes as its model
        edge.limits.check_tokenize(body, facts.max_model_len)
        return await tokenize_api.tokenize(
            context.tokenizer, body, model=facts.model, max_model_len=facts.max_model_len
        )

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        context.adapters.resolve(body.model, context.model.model)
        return await tokenize_api.detokenize(context.tokenizer, body)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatCompletionRequest, request: Request) -> JSONResponse | StreamingResponse:
        return await handlers.chat(body, request)

    # The body is read raw (its conversations are counted before any is validated); its
    # schema is declared for clients and for the fuzz tests (schemathesis reads /openapi.json).
    @app.post("/v1/chat/completions/batch", response_model=None, openapi_extra=_json_body(BATCH_CHAT_SCHEMA))
    async def chat_batch(request: Request) -> JSONResponse:
        return await handlers.chat_batch(request)

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> JSONResponse | StreamingResponse:
        return await handlers.completions(body, request)

    @app.post("/invocations", response_model=None, openapi_extra=_json_body(INVOCATION_SCHEMA))
    async def invocations(request: Request) -> JSONResponse | StreamingResponse:
        """SageMaker's entry point, as vLLM serves it: the body goes to the first endpoint
        whose request type it validates as (chat completions, then completions)."""
        body = await invocation_body(request)
        if isinstance(body, dict):  # the one bound both request types share, named clearly
            request_ids.check(body.get("request_id"))
        with contextlib.suppress(ValidationError):
            return await handlers.chat(ChatCompletionRequest.model_validate(body), request)
        with contextlib.suppress(ValidationError):
            return await handlers.completions(CompletionRequest.model_validate(body), request)
        raise errors.invalid(
            "Cannot find suitable handler for request. Expected one of: "
            "['ChatCompletionRequest', 'CompletionRequest']"
        )

    if context.adapters.runtime_updates:  # vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING

        @app.post("/v1/load_lora_adapter")
        async def load_lora_adapter(body: LoadLoraAdapterRequest) -> Response:
            return Response(await context.adapters.load(body, context.model.model, context.workers.endpoints))

        @app.post("/v1/unload_lora_adapter")
        async def unload_lora_adapter(body: UnloadLoraAdapterRequest) -> Response:
            return Response(context.adapters.unload(body))

    @app.get("/ping")
    async def ping(request: Request) -> JSONResponse:
        """SageMaker's health check: the same answer as /health, as open (SageMaker sends no key)."""
        return await health(request)

    @app.post("/ping")
    async def ping_post(request: Request) -> JSONResponse:
        return await health(request)

    edge.install(app)
    # Outermost: counts the edge's refusals (401, 413) too.
    app.add_middleware(RequestCounter, endpoints={getattr(route, "path", "") for route in app.routes})
    return app


_SCHEMAS = "#/components/schemas"
# /v1/chat/completions/batch: a chat completion request whose `messages` is a list of
# conversations (vLLM's BatchChatCompletionRequest); the other fields are chat's.
BATCH_CHAT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        "model": {"type": "string"},
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "array", "minItems": 1, "items": {"$ref": f"{_SCHEMAS}/ChatMessageIn"}},
        },
        "max_tokens": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]},
        "request_id": {"type": "string", "maxLength": request_ids.MAX_REQUEST_ID_CHARS},
    },
    "additionalProperties": True,
}
# /invocations (SageMaker's): a chat completion or a completion request.
INVOCATION_SCHEMA: dict[str, Any] = {
    "anyOf": [{"$ref": f"{_SCHEMAS}/ChatCompletionRequest"}, {"$ref": f"{_SCHEMAS}/CompletionRequest"}]
}


def _json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _error_handlers(app: FastAPI) -> None:
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
