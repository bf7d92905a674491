"""gRPC adapter of the tokenizer: messages in and out, errors -> status codes through
libs.rpc.errors (bad input -> INVALID_ARGUMENT, a bug -> INTERNAL with a fixed message).

The unary calls (templating, tokenizing, whole-text decoding: milliseconds to seconds for a
long prompt) run on a bounded pool of threads, each with its own copy of the tokenizer
(libs/tokenization/offload.py), so one huge prompt does not stall the other requests. The
streaming detokenizer's per-token work stays on the event loop: microseconds a token.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import grpc
import grpc.aio
import structlog

from cleave.common.v1 import common_pb2
from cleave.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from libs.observability.logging import bind_request_id
from libs.rpc import errors
from libs.rpc.errors import FailedPrecondition, InvalidRequest
from libs.rpc.server import ServiceBinding
from libs.tokenization import ChatMessage, Tokenizer
from libs.tokenization.offload import TokenizerThreads
from libs.tokenization.session import DetokenizeSession, check_token_ids
from libs.tokenization.tools import ToolCallParser, message_tool_fields, tool_dicts

log = structlog.get_logger(__name__)
T = TypeVar("T")

SERVICE_NAME = tokenizer_pb2.DESCRIPTOR.services_by_name["Tokenizer"].full_name
SERVICE = "tokenizer"
# What a client sees for a bug on our side; the details go to the log, never to the client.
INTERNAL_MESSAGE = errors.internal_message(SERVICE)


def _bind(metadata: common_pb2.RequestMetadata) -> None:
    # The interceptor already bound x-request-id (or a fresh id); an id in the message is the
    # caller's explicit one. Each RPC runs in its own task, so this cannot leak.
    if metadata.request_id:
        bind_request_id(metadata.request_id)


def chat_messages(messages: Sequence[tokenizer_pb2.ChatMessage]) -> list[ChatMessage]:
    """Content parts -> one text per message; roles are checked by libs.tokenization."""
    converted: list[ChatMessage] = []
    for index, message in enumerate(messages):
        texts: list[str] = []
        parts: list[dict[str, str]] = []
        for part_index, part in enumerate(message.content):
            kind = part.WhichOneof("part")
            where = f"messages[{index}].content[{part_index}]"
            if kind is None:
                raise InvalidRequest(f"{where} is empty; set text")
            if kind == "image":
                parts.append({"type": "image"})
            else:
                texts.append(part.text)
                parts.append({"type": "text", "text": part.text})
        # vLLM joins a message's text parts with newlines before templating; do the same so
        # a prompt renders to the same ids on either stack. A message with images goes to
        # the template as its parts, in order (vLLM's "openai" content format: the template
        # writes each image's placeholder, which the engine expands). `name` is dropped:
        # ChatML templates (SmolLM2's included) do not render it.
        content: str | list[dict[str, str]] = parts if len(parts) > len(texts) else "\n".join(texts)
        converted.append(
            ChatMessage(
                role=message.role,
                content=content,
                extra={
                    **_json_object(message.extra_json, where=f"messages[{index}]"),
                    **_tool_fields(message, index),
                },
            )
        )
    return converted


def _tool_fields(message: tokenizer_pb2.ChatMessage, index: int) -> dict[str, Any]:
    try:
        return message_tool_fields(message.tool_calls, message.tool_call_id)
    except ValueError as error:
        raise InvalidRequest(f"messages[{index}]: {error}") from None


def _json_object(text: str, *, where: str) -> dict[str, Any]:
    """An optional JSON object field of a request ({} when empty)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as error:
        raise InvalidRequest(f"{where}: not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise InvalidRequest(f"{where}: expected a JSON object")
    return value


class TokenizerServicer(tokenizer_pb2_grpc.TokenizerServicer):
    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        model: str,
        max_model_len: int,
        max_concurrent_tokenizations: int = 0,
        tool_parser: ToolCallParser | None = None,
    ) -> None:
        self._tokenizer = tokenizer  # the event loop's own (DetokenizeStream, GetInfo)
        self._tool_parser = tool_parser  # --tool-call-parser (libs/tokenization/vllm_tool_parsing.py)
        self._threads = TokenizerThreads(tokenizer, max_concurrent_tokenizations)
        self._model = model
        self._max_model_len = max_model_len

    async def _unary(
        self, method: str, context: grpc.aio.ServicerContext, call: Callable[[Tokenizer], T]
    ) -> T:
        try:
            return await self._threads.run(call)
        except Exception as error:
            await errors.abort(context, error, service=SERVICE, method=method)

    def close(self) -> None:
        self._threads.close()

    async def RenderChat(
        self, request: tokenizer_pb2.RenderChatRequest, context: grpc.aio.ServicerContext
    ) -> tokenizer_pb2.RenderChatResponse:
        _bind(request.metadata)
        return await self._unary(
            "RenderChat", context, lambda tokenizer: self._render_chat(tokenizer, request)
        )

    def _render_chat(
        self, tokenizer: Tokenizer, request: tokenizer_pb2.RenderChatRequest
    ) -> tokenizer_pb2.RenderChatResponse:
        if not tokenizer.has_chat_template:
            # The server's setup, not the request, is at fault; say what still works.
            raise FailedPrecondition(
                f"model {self._model!r} has no chat template; send a plain prompt (Tokenize) instead"
            )
        if request.continue_final_message and request.add_generation_prompt:
            raise InvalidRequest(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
            )
        messages = chat_messages(request.messages)
        kwargs = _json_object(request.chat_template_kwargs_json, where="chat_template_kwargs")
        try:
            tools = tool_dicts(request.tools_json)
        except ValueError as error:
            raise InvalidRequest(str(error)) from None
        if tools is not None:
            # As vLLM passes them: apply_chat_template(tools=...), which the template renders.
            kwargs = {**kwargs, "tools": tools}
        try:
            prompt = tokenizer.render_chat(
                messages,
                add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message,
                template_kwargs=kwargs,
            )
        except ValueError as error:  # bad roles/content, or the template's raise_exception()
            raise InvalidRequest(str(error)) from error
        # The rendered text already holds the template's special tokens (bos included where
        # the template writes it): adding them again would double bos. vLLM's chat path
        # tokenizes with add_special_tokens=False too, so the engine sees the same ids.
        # `add_special_tokens` (vLLM's chat option, off by default) adds them anyway.
        token_ids = tokenizer.encode(prompt, add_special_tokens=request.add_special_tokens)
        num_images = sum(part.WhichOneof("part") == "image" for m in request.messages for part in m.content)
        return tokenizer_pb2.RenderChatResponse(prompt=prompt, token_ids=token_ids, num_images=num_images)

    async def Tokenize(
        self, request: tokenizer_pb2.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> tokenizer_pb2.TokenizeResponse:
        _bind(request.metadata)
        return await self._unary("Tokenize", context, lambda tokenizer: _tokenize(tokenizer, request))

    async def Detokenize(
        self, request: tokenizer_pb2.DetokenizeRequest, context: grpc.aio.ServicerContext
    ) -> tokenizer_pb2.DetokenizeResponse:
        _bind(request.metadata)
        return await self._unary("Detokenize", context, lambda tokenizer: _detokenize(tokenizer, request))

    async def ParseToolCalls(
        self, request: tokenizer_pb2.ParseToolCallsRequest, context: grpc.aio.ServicerContext
    ) -> tokenizer_pb2.ParseToolCallsResponse:
        _bind(request.metadata)
        parser = self._tool_parser

        def parse(tokenizer: Tokenizer) -> tokenizer_pb2.ParseToolCallsResponse:
            if parser is None:
                # The deployment's setup (the gateway enables `auto` only with a parser here).
                raise FailedPrecondition("this tokenizer service has no --tool-call-parser")
            try:
                parsed = parser.parse(request.text, request.tools_json, tokenizer.hf_tokenizer)
            except ValueError as error:  # tools that are not valid JSON or not vLLM's tool shape
                raise InvalidRequest(f"tools: {error}") from None
            return tokenizer_pb2.ParseToolCallsResponse(
                tools_called=parsed.tools_called,
                tool_calls=[
                    tokenizer_pb2.ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in parsed.calls
                ],
                content=parsed.content,
            )

        return await self._unary("ParseToolCalls", context, parse)

    async def ParseToolCallsStream(
        self,
        request_iterator: AsyncIterator[tokenizer_pb2.ParseToolCallsStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[tokenizer_pb2.ParseToolCallsStreamResponse]:
        """Protocol errors and a `start` that cannot be served end the call (INVALID_ARGUMENT,
        FAILED_PRECONDITION) before any response; each `delta` then gets one response. The
        per-delta work (a partial-JSON scan, vLLM's parser) stays on the event loop: it is
        small, like the streaming detokenizer's."""
        from libs.tokenization.vllm_tool_parsing import StreamingToolCalls

        requests = aiter(request_iterator)
        first = await anext(requests, None)
        try:
            if first is None or first.WhichOneof("kind") != "start":
                got = "nothing" if first is None else f"`{first.WhichOneof('kind')}`"
                raise InvalidRequest(f"the first message must be `start`, got {got}")
            _bind(first.start.metadata)
            parser = self._tool_parser
            if first.start.tool_choice == "auto" and parser is None:
                raise FailedPrecondition("this tokenizer service has no --tool-call-parser")
            try:
                session = StreamingToolCalls(
                    first.start.tool_choice,
                    first.start.tools_json,
                    self._tokenizer.hf_tokenizer,
                    parser,  # type: ignore[arg-type]
                )
            except ValueError as error:  # tools that are not vLLM's tool shape, a bad tool_choice
                raise InvalidRequest(f"tools: {error}") from None
        except Exception as error:
            await errors.abort(context, error, service=SERVICE, method="ParseToolCallsStream")
        async for message in requests:
            if message.WhichOneof("kind") != "delta":
                await errors.abort(
                    context,
                    InvalidRequest("expected `delta`"),
                    service=SERVICE,
                    method="ParseToolCallsStream",
                )
            delta = message.delta
            try:
                parsed = session.feed(delta.text, list(delta.token_ids), delta.finished)
            except Exception as error:
                await errors.abort(context, error, service=SERVICE, method="ParseToolCallsStream")
            response = tokenizer_pb2.ParseToolCallsStreamResponse(
                tool_calls=[
                    tokenizer_pb2.ToolCallDelta(index=c.index, id=c.id, name=c.name, arguments=c.arguments)
                    for c in parsed.calls
                ]
            )
            if parsed.content is not None:
                response.content = parsed.content
            yield response
            if delta.finished:
                return

    async def GetInfo(
        self, request: tokenizer_pb2.GetInfoRequest, context: grpc.aio.ServicerContext
    ) -> tokenizer_pb2.TokenizerInfo:
        tokenizer = self._tokenizer
        return tokenizer_pb2.TokenizerInfo(
            model=self._model,
            vocab_size=tokenizer.vocab_size,
            eos_token_ids=tokenizer.eos_token_ids,
            bos_token_id=tokenizer.bos_token_id,  # None leaves the optional field unset
            max_model_len=self._max_model_len,
            has_chat_template=tokenizer.has_chat_template,
        )

    async def GetDecoder(
        self, request: tokenizer_pb2.GetDecoderRequest, context: grpc.aio.ServicerContext
    ) -> tokenizer_pb2.DecoderSpec:
        return tokenizer_pb2.DecoderSpec(
            tokenizer_json=self._tokenizer.decoder_json() or "", vocab_size=self._tokenizer.vocab_size
        )

    async def DetokenizeStream(
        self,
        request_iterator: AsyncIterator[tokenizer_pb2.DetokenizeStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[tokenizer_pb2.DetokenizeStreamResponse]:
        """Protocol errors before the stream starts (no or a bad `start`) end the call with
        INVALID_ARGUMENT; once started, each `tokens` or `finish` gets exactly one response, and
        the stream ends with the first `complete` or `error`."""
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        try:
            if first is None or first.WhichOneof("kind") != "start":
                got = "nothing" if first is None else f"`{first.WhichOneof('kind')}`"
                raise InvalidRequest(f"the first message must be `start`, got {got}")
            _bind(first.start.metadata)
            session = DetokenizeSession(self._tokenizer, first.start)
        except Exception as error:
            await errors.abort(context, error, service=SERVICE, method="DetokenizeStream")
        async for message in _finish_at_end(requests):
            kind = message.WhichOneof("kind")
            try:
                if kind == "tokens":
                    response = session.feed(message.tokens.token_ids)
                elif kind == "finish":
                    response = session.finish()
                else:
                    raise InvalidRequest(f"expected `tokens` or `finish`, got {kind or 'an empty message'}")
            except Exception as error:
                error_message = errors.stream_error(error, service=SERVICE, method="DetokenizeStream")
                yield tokenizer_pb2.DetokenizeStreamResponse(error=error_message)
                return
            yield response
            if session.done:
                # A stop string or `finish` ended the text; later input has nothing to add.
                log.debug("detokenize stream done", num_tokens=session.num_tokens)
                return


def _tokenize(tokenizer: Tokenizer, request: tokenizer_pb2.TokenizeRequest) -> tokenizer_pb2.TokenizeResponse:
    token_ids = tokenizer.encode(request.text, add_special_tokens=request.add_special_tokens)
    # Each token decoded on its own (special tokens kept): readable text, where vLLM's
    # convert_ids_to_tokens would show byte-level forms like "Ġhello". A token holding
    # part of a multi-byte character decodes to U+FFFD.
    if not request.return_token_strs:
        return tokenizer_pb2.TokenizeResponse(token_ids=token_ids)
    token_strs = [tokenizer.decode([token_id]) for token_id in token_ids]
    return tokenizer_pb2.TokenizeResponse(token_ids=token_ids, token_strs=token_strs)


def _detokenize(
    tokenizer: Tokenizer, request: tokenizer_pb2.DetokenizeRequest
) -> tokenizer_pb2.DetokenizeResponse:
    token_ids = list(request.token_ids)
    check_token_ids(token_ids, tokenizer.vocab_size, "token_ids")
    text = tokenizer.decode(token_ids, skip_special_tokens=request.skip_special_tokens)
    return tokenizer_pb2.DetokenizeResponse(text=text)


async def _finish_at_end(
    requests: AsyncIterator[tokenizer_pb2.DetokenizeStreamRequest],
) -> AsyncIterator[tokenizer_pb2.DetokenizeStreamRequest]:
    """A client that half-closes without `finish` means the same: the engine is done."""
    async for request in requests:
        yield request
    yield tokenizer_pb2.DetokenizeStreamRequest(finish=True)


def binding(servicer: TokenizerServicer) -> ServiceBinding:
    return ServiceBinding(SERVICE_NAME, servicer, tokenizer_pb2_grpc.add_TokenizerServicer_to_server)
