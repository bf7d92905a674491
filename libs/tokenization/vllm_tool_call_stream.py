"""The ParseToolCallsStream protocol, one sequence's: a `start`, checked and turned into vLLM's
streaming parser (vllm_tool_parsing.StreamingToolCalls), then `delta`s, each answered by one
response, up to the one marked finished. Anything wrong is raised: a bad or unservable
`start` (INVALID_ARGUMENT, FAILED_PRECONDITION) before any response. The per-delta work (a
partial-JSON scan, vLLM's parser) is small: the tokenizer service runs it on its event loop,
like the streaming detokenizer's."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from cleave.tokenizer.v1 import tokenizer_pb2
from libs.rpc.errors import FailedPrecondition, InvalidRequest
from libs.tokenization.stream_protocol import bind_request, first_start
from libs.tokenization.tool_call_requests import NO_PARSER
from libs.tokenization.tools import ToolCallParser
from libs.tokenization.vllm_tool_parsing import StreamingToolCalls

Request = tokenizer_pb2.ParseToolCallsStreamRequest
Response = tokenizer_pb2.ParseToolCallsStreamResponse
Start = Request.Start
Delta = Request.Delta


async def tool_call_stream(
    requests: AsyncIterator[Request], hf_tokenizer: Any, parser: ToolCallParser | None
) -> AsyncGenerator[Response, None]:
    requests = aiter(requests)
    start = (await first_start(requests)).start
    bind_request(start.metadata)
    stream = ToolCallStream(start, hf_tokenizer, parser)
    async for message in requests:
        if message.WhichOneof("kind") != "delta":
            raise InvalidRequest("expected `delta`")
        yield stream.feed(message.delta)
        if message.delta.finished:
            return


class ToolCallStream:
    def __init__(self, start: Start, hf_tokenizer: Any, parser: ToolCallParser | None) -> None:
        """Raises FailedPrecondition (`auto` without a parser) or InvalidRequest (tools that
        are not vLLM's tool shape, a bad tool_choice)."""
        if start.tool_choice == "auto" and parser is None:
            raise FailedPrecondition(NO_PARSER)
        try:
            # `auto` streams through vLLM's own parser class: only a VllmToolCallParser has one.
            self._session = StreamingToolCalls(
                start.tool_choice,
                start.tools_json,
                hf_tokenizer,
                parser,  # type: ignore[arg-type]
            )
        except ValueError as error:
            raise InvalidRequest(f"tools: {error}") from None

    def feed(self, delta: Delta) -> Response:
        parsed = self._session.feed(delta.text, list(delta.token_ids), delta.finished)
        response = Response(
            tool_calls=[
                tokenizer_pb2.ToolCallDelta(index=c.index, id=c.id, name=c.name, arguments=c.arguments)
                for c in parsed.calls
            ]
        )
        if parsed.content is not None:
            response.content = parsed.content
        return response
