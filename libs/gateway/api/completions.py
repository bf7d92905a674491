"""The completions and chat completions endpoints: a validated body -> prompt token ids (the
tokenizer service) -> one GenerationSpec per prompt -> the serving room's events -> a whole
response or a stream of server-sent events, as vLLM's OpenAI server answers them."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, TypeVar

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import Request

from cleave.tokenizer.v1 import tokenizer_pb2
from libs.gateway.api import batch_chat, beam_search, multi_prompt, request_ids, responses
from libs.gateway.api.cancellation import gather_or_cancel, until_disconnected
from libs.gateway.api.context import ApiContext
from libs.gateway.api.extensions import bad_words_token_ids
from libs.gateway.api.http.auth import combined_salt
from libs.gateway.api.http.edge import HttpEdge
from libs.gateway.api.images import encoded_images, image_cache_salt, image_files, image_files_salt
from libs.gateway.api.openai_api import ChatCompletionRequest, CompletionRequest, StreamOptions
from libs.gateway.api.requests import (
    chat_prompt,
    chat_render,
    check_supported,
    completion_prompts,
    tokenizer_call,
)
from libs.gateway.api.response_extras import chat_extras, token_id_labels
from libs.gateway.api.spec import generation_spec
from libs.gateway.api.streaming import StreamFormat, sse_events, started
from libs.gateway.api.tools import ToolCalling, tool_calling
from libs.gateway.api.vllm_fields import warn_unknown
from libs.gateway.common import errors
from libs.gateway.common.generation import GenerationSpec

Body = TypeVar("Body", ChatCompletionRequest, CompletionRequest)


class Completions:
    def __init__(self, context: ApiContext, edge: HttpEdge) -> None:
        self._context = context
        self._edge = edge
        self._texts = responses.TokenizerTexts(context.tokenizer, context.decoder)

    def _check(self, body: ChatCompletionRequest | CompletionRequest) -> None:
        self._context.adapters.resolve(body.model, self._context.model.model)  # or vLLM's 404
        check_supported(body)
        self._edge.limits.check(body, self._context.model.max_model_len)
        self._context.check_logprobs(body)

    def _salted(self, body: Body, request: Request) -> Body:
        """With --cache-salt-per-api-key: the body with its API key's cache salt in front of
        its own, so the engines and the kvstore reuse KV only within one tenant."""
        tenant = self._edge.tenant_salt(request.scope.get("headers", ()))
        salt = combined_salt(tenant, body.cache_salt)
        return body if salt == body.cache_salt else body.model_copy(update={"cache_salt": salt})

    # -- chat ------------------------------------------------------------------------------
    async def chat(self, body: ChatCompletionRequest, request: Request) -> JSONResponse | StreamingResponse:
        self._check(body)
        body = self._salted(body, request)
        if body.stream:
            return await until_disconnected(request.receive, self._chat_stream(body))
        return await until_disconnected(request.receive, self._chat_whole(body))

    async def chat_batch(self, request: Request) -> JSONResponse:
        """vLLM's batched chat completions (batch_chat.py)."""
        request_id, bodies = batch_chat.split(
            await invocation_body(request), self._edge.limits, self._context.model.max_model_len
        )
        for body in bodies:
            self._check(body)
        bodies = [self._salted(body, request) for body in bodies]
        # The conversations run concurrently; one failing cancels the others.
        answers = gather_or_cancel(*(self._chat_object(body) for body in bodies))
        return JSONResponse(batch_chat.merge(request_id, await until_disconnected(request.receive, answers)))

    async def _chat_stream(self, body: ChatCompletionRequest) -> StreamingResponse:
        context = self._context
        prompt = await tokenizer_call(chat_prompt(context.tokenizer, body))
        top = body.top_logprobs or 0
        spec = self._spec(body, prompt, body.requested_max_tokens(), top if body.logprobs else None)
        spec = await self._with_images(body, spec)
        await self._bad_words(body, [spec])
        calling = tool_calling(body, context.tokenizer, auto_enabled=context.options.enable_auto_tool_choice)
        return await self._stream(
            spec, chat=True, options=body.stream_options, top=top, tools=calling, body=body
        )

    async def _chat_whole(self, body: ChatCompletionRequest) -> JSONResponse:
        return JSONResponse(await self._chat_object(body))

    async def _chat_object(self, body: ChatCompletionRequest) -> dict[str, Any]:
        context = self._context
        calling = tool_calling(body, context.tokenizer, auto_enabled=context.options.enable_auto_tool_choice)
        rendered = await tokenizer_call(chat_render(context.tokenizer, body))
        top_logprobs = (body.top_logprobs or 0) if body.logprobs else None
        spec = self._spec(body, list(rendered.token_ids), body.requested_max_tokens(), top_logprobs)
        spec = await self._with_images(body, spec)
        await self._bad_words(body, [spec])
        generation = await responses.collect(await self._generator(body), spec)
        return await responses.chat_completion(
            spec,
            generation,
            model=spec.served_as,
            response_id=body.request_id,
            top_logprobs=top_logprobs,
            token_text=_token_text(context, body, self._texts),
            tools=calling,
            extras=chat_extras(body, spec.prompt_token_ids, rendered.prompt),
            prompt_texts=self._texts.token_texts,
        )

    # -- completions -----------------------------------------------------------------------
    async def completions(
        self, body: CompletionRequest, request: Request
    ) -> JSONResponse | StreamingResponse:
        self._check(body)
        body = self._salted(body, request)
        if body.stream:
            return await until_disconnected(request.receive, self._completions_stream(body))
        return await until_disconnected(request.receive, self._completions_whole(body))

    async def _completions_stream(self, body: CompletionRequest) -> StreamingResponse:
        specs = await self._completion_specs(body)
        top = body.logprobs or 0
        if len(specs) == 1:
            return await self._stream(specs[0], chat=False, options=body.stream_options, top=top, body=body)
        if body.echo or body.return_token_ids:
            # Both name one prompt per stream (its text, its ids) in Cleave's stream writer.
            raise errors.unsupported("streaming several prompts with echo or return_token_ids", "prompt")
        # vLLM's: all prompts at once in one stream, choice index = prompt x n + index.
        return await self._stream(
            specs[0],
            chat=False,
            options=body.stream_options,
            top=top,
            body=body,
            generate=multi_prompt.merged(self._context.serving.generate, specs),
            choice_prompt_tokens=multi_prompt.choice_prompt_tokens(specs),
        )

    async def _completion_specs(self, body: CompletionRequest) -> list[GenerationSpec]:
        prompts = await tokenizer_call(completion_prompts(self._context.tokenizer, body))
        ids = _prompt_request_ids(body.request_id, len(prompts))
        specs = [
            self._spec(body, prompt, body.max_tokens, body.logprobs, request_id=request_id)
            for prompt, request_id in zip(prompts, ids, strict=True)
        ]
        await self._bad_words(body, specs)
        return specs

    async def _completions_whole(self, body: CompletionRequest) -> JSONResponse:
        specs = await self._completion_specs(body)
        # Several prompts run concurrently; one failing cancels the others.
        generate = await self._generator(body)
        generations = await gather_or_cancel(*(responses.collect(generate, spec) for spec in specs))
        return JSONResponse(
            await responses.text_completion(
                specs,
                generations,
                model=specs[0].served_as,
                logprobs=body.logprobs,
                echo=body.echo,
                texts=self._texts,
                return_token_ids=bool(body.return_token_ids),
                token_text=_token_text(self._context, body, self._texts),
                response_id=body.request_id,
            )
        )

    # -- shared steps ----------------------------------------------------------------------
    def _spec(
        self,
        body: Any,
        prompt: list[int],
        max_tokens: int | None,
        logprobs: int | None,
        *,
        request_id: str | None = None,
    ) -> GenerationSpec:
        # The client's id names the response; the request's work runs under a unique one.
        request_id = request_ids.internal(request_id or body.request_id)
        warn_unknown(body.model_extra, request_id)
        facts = self._context.model
        return generation_spec(
            body,
            prompt,
            model=facts.model,
            max_model_len=facts.max_model_len,
            max_tokens=max_tokens,
            logprobs=logprobs,
            max_tokens_cap=self._edge.limits.max_tokens_cap,
            default_max_tokens=facts.default_max_tokens,
            prompt_tokens_details=self._context.options.prompt_tokens_details,
            request_id=request_id,
            lora=self._context.adapters.resolve(body.model, facts.model),
        )

    async def _generator(self, body: ChatCompletionRequest | CompletionRequest) -> responses.Generate:
        """The serving room, or (use_beam_search) beam search over its one-token steps."""
        if not body.use_beam_search:
            return self._context.serving.generate
        info = await self._context.tokenizer.GetInfo(tokenizer_pb2.GetInfoRequest())
        if not info.eos_token_ids:
            raise errors.invalid(
                "beam search needs the model's EOS token; its tokenizer names none", "use_beam_search"
            )
        # vLLM's beam search stops beams on the tokenizer's eos_token_id (the first listed).
        return beam_search.runner(
            self._context.serving.generate, body.length_penalty, info.eos_token_ids[0], self._texts.text
        )

    async def _with_images(self, body: ChatCompletionRequest, spec: GenerationSpec) -> GenerationSpec:
        """The spec with the encoder's embeddings of the conversation's images (if any), and
        their content hashes in the cache salt (images.py). Without an encoder but with a
        vision-language model: the image files, for the workers' engines to encode."""
        worker_images = self._context.worker_images()
        if worker_images is not None:
            files = await image_files(body, worker_images)
            if not files:
                return spec
            return dataclasses.replace(
                spec, images=tuple(files), cache_salt=image_files_salt(spec.cache_salt, files)
            )
        encoded = await encoded_images(self._context.encoder, body, spec.request_id)
        if not encoded:
            return spec
        return dataclasses.replace(
            spec,
            image_embeddings=tuple(e.embeddings for e in encoded),
            cache_salt=image_cache_salt(spec.cache_salt, encoded),
        )

    async def _bad_words(self, body: Any, specs: list[GenerationSpec]) -> None:
        """vLLM's bad_words, tokenized here for the engines (which have no tokenizer)."""
        if not body.bad_words:
            return
        ids = await tokenizer_call(bad_words_token_ids(self._context.tokenizer, body.bad_words))
        for spec in specs:
            spec.sampling.bad_words_token_ids.extend(ids)

    async def _stream(
        self,
        spec: GenerationSpec,
        *,
        chat: bool,
        options: StreamOptions | None,
        top: int,
        tools: ToolCalling | None = None,
        body: Any = None,
        generate: responses.Generate | None = None,  # default: the serving room
        choice_prompt_tokens: tuple[int, ...] = (),  # several prompts: each choice's prompt length
    ) -> StreamingResponse:
        # Failures before the first token get their own HTTP status, not an event in a 200 stream.
        began = time.perf_counter()
        context = self._context
        generate = await started(generate or context.serving.generate, spec)
        fmt = StreamFormat(
            chat=chat,
            model=spec.served_as,
            response_id=body.request_id if body is not None else spec.request_id,
            options=_stream_options(options, force_usage=context.options.force_include_usage),
            top_logprobs=top,
            tools=tools,
            return_token_ids=bool(body is not None and body.return_token_ids),
            choice_prompt_tokens=choice_prompt_tokens,
            **(await self._stream_echo(spec, body, chat=chat)),
        )
        token_texts = _token_text(context, body, self._texts) if body is not None else self._texts.token_texts
        events = sse_events(generate, spec, fmt, token_texts, started_s=began)
        return StreamingResponse(events, media_type="text/event-stream")

    async def _stream_echo(self, spec: GenerationSpec, body: Any, *, chat: bool) -> dict[str, Any]:
        """A stream's reply role and echo, as vLLM's streaming serving sends them."""
        if body is None:
            return {}
        if chat:
            extras = chat_extras(body, spec.prompt_token_ids, "")
            return {"role": extras.role, "echo_text": extras.echo_text}
        if not body.echo:
            return {}
        return {"echo_text": await self._texts.text(spec.prompt_token_ids)}


async def invocation_body(request: Request) -> Any:
    try:
        return await request.json()
    except ValueError as error:  # not JSON, or not UTF-8
        raise errors.invalid(f"the body is not valid JSON: {error}") from error


def _prompt_request_ids(request_id: str, prompts: int) -> list[str]:
    """The client's request id for one prompt; `<id>-<i>` for each of several (as vLLM); each
    gets its own random suffix in `_spec`."""
    return [request_id] if prompts == 1 else [f"{request_id}-{i}" for i in range(prompts)]


def _token_text(context: ApiContext, body: Any, texts: responses.TokenizerTexts) -> responses.TokenText:
    """How logprobs name tokens: `token_id:<id>` with return_tokens_as_token_ids, else text.
    A request that leaves it unset gets the server's --return-tokens-as-token-ids (vLLM's
    `return_as_token_id if not None else self.return_tokens_as_token_ids`)."""
    asked = body.return_tokens_as_token_ids
    as_ids = context.options.return_tokens_as_token_ids if asked is None else asked
    return token_id_labels if as_ids else texts.token_texts


def _stream_options(options: StreamOptions | None, *, force_usage: bool) -> StreamOptions:
    """vLLM's should_include_usage: the server's force flag means usage at the end and on
    every chunk; otherwise what the request asked for."""
    if force_usage:
        return StreamOptions(include_usage=True, continuous_usage_stats=True)
    return options or StreamOptions()
