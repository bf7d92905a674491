"""gRPC adapter of the tokenizer: each call handed to libs/tokenization, errors -> status
codes through libs.rpc.methods (bad input -> INVALID_ARGUMENT, a bug -> INTERNAL with a fixed
message).

The unary calls (templating, tokenizing, whole-text decoding: milliseconds to seconds for a
long prompt) run on a bounded pool of threads, each with its own copy of the tokenizer
(libs/tokenization/offload.py), so one huge prompt does not stall the other requests. The
streams' per-token work stays on the event loop: microseconds a token.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, AsyncIterator

import grpc
import grpc.aio

from cleave.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from libs.rpc import errors
from libs.rpc.methods import rpc_method, rpc_stream
from libs.rpc.server import ServiceBinding
from libs.tokenization import Tokenizer
from libs.tokenization.chat_request import render_chat
from libs.tokenization.detokenize_stream import detokenize_stream
from libs.tokenization.offload import TokenizerThreads
from libs.tokenization.service_info import decoder_spec, tokenizer_info
from libs.tokenization.stream_protocol import bind_request
from libs.tokenization.text_requests import detokenize, tokenize
from libs.tokenization.tool_call_requests import parse_tool_calls
from libs.tokenization.tools import ToolCallParser

SERVICE_NAME = tokenizer_pb2.DESCRIPTOR.services_by_name["Tokenizer"].full_name
SERVICE = "tokenizer"
# What a client sees for a bug on our side; the details go to the log, never to the client.
INTERNAL_MESSAGE = errors.internal_message(SERVICE)


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
        self._tokenizer = tokenizer  # the event loop's own (the streams, GetInfo)
        self._tool_parser = tool_parser  # --tool-call-parser (libs/tokenization/vllm_tool_parsing.py)
        self._threads = TokenizerThreads(tokenizer, max_concurrent_tokenizations)
        self._model = model
        self._max_model_len = max_model_len

    def close(self) -> None:
        self._threads.close()

    @rpc_method(service=SERVICE)
    async def RenderChat(
        self, request: tokenizer_pb2.RenderChatRequest, context: grpc.aio.ServicerContext
    ) -> tokenizer_pb2.RenderChatResponse:
        bind_request(request.metadata)
        return await self._threads.run(functools.partial(render_chat, request=request, model=self._model))

    @rpc_method(service=SERVICE)
    async def Tokenize(
        self, request: tokenizer_pb2.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> tokenizer_pb2.TokenizeResponse:
        bind_request(request.metadata)
        return await self._threads.run(functools.partial(tokenize, request=request))

    @rpc_method(service=SERVICE)
    async def Detokenize(
        self, request: tokenizer_pb2.DetokenizeRequest, context: grpc.aio.ServicerContext
    ) -> tokenizer_pb2.DetokenizeResponse:
        bind_request(request.metadata)
        return await self._threads.run(functools.partial(detokenize, request=request))

    @rpc_method(service=SERVICE)
    async def ParseToolCalls(
        self, request: tokenizer_pb2.ParseToolCallsRequest, context: grpc.aio.ServicerContext
    ) -> tokenizer_pb2.ParseToolCallsResponse:
        bind_request(request.metadata)
        return await self._threads.run(
            functools.partial(parse_tool_calls, request=request, parser=self._tool_parser)
        )

    # The streams are libs/tokenization's generators, returned as they are: the wrapper
    # iterates them and closes them when the call ends.
    @rpc_stream(service=SERVICE)
    def ParseToolCallsStream(
        self,
        request_iterator: AsyncIterator[tokenizer_pb2.ParseToolCallsStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncGenerator[tokenizer_pb2.ParseToolCallsStreamResponse, None]:
        # vLLM is imported on the first such call only.
        from libs.tokenization.vllm_tool_call_stream import tool_call_stream

        return tool_call_stream(request_iterator, self._tokenizer.hf_tokenizer, self._tool_parser)

    @rpc_stream(service=SERVICE)
    def DetokenizeStream(
        self,
        request_iterator: AsyncIterator[tokenizer_pb2.DetokenizeStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncGenerator[tokenizer_pb2.DetokenizeStreamResponse, None]:
        return detokenize_stream(self._tokenizer, request_iterator, service=SERVICE)

    async def GetInfo(
        self, request: tokenizer_pb2.GetInfoRequest, context: grpc.aio.ServicerContext
    ) -> tokenizer_pb2.TokenizerInfo:
        return tokenizer_info(self._tokenizer, model=self._model, max_model_len=self._max_model_len)

    async def GetDecoder(
        self, request: tokenizer_pb2.GetDecoderRequest, context: grpc.aio.ServicerContext
    ) -> tokenizer_pb2.DecoderSpec:
        return decoder_spec(self._tokenizer)


def binding(servicer: TokenizerServicer) -> ServiceBinding:
    return ServiceBinding(SERVICE_NAME, servicer, tokenizer_pb2_grpc.add_TokenizerServicer_to_server)
