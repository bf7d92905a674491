"""One streamed sequence's tool calls, parsed by the tokenizer service as the text arrives
(`Tokenizer.ParseToolCallsStream`): vLLM's streaming parsers run there, beside the tokenizer
they are built on; the gateway sends each delta's text and token ids and gets back what to
send as content and as `delta.tool_calls`.

Failures are the tokenizer's (or, when it refuses the tools at `start`, the client's) and
surface as `errors.ApiError`, never as a gRPC error the pipeline would blame on a worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc
import grpc.aio

from cleave.common.v1 import common_pb2
from cleave.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from libs.gateway.common import errors

Request = tokenizer_pb2.ParseToolCallsStreamRequest


class ToolCallsStream:
    def __init__(
        self,
        stub: tokenizer_pb2_grpc.TokenizerStub,
        *,
        tool_choice: str,
        tools_json: str,
        request_id: str = "",
    ) -> None:
        self._requests: asyncio.Queue[Request | None] = asyncio.Queue()
        start = Request.Start(
            metadata=common_pb2.RequestMetadata(request_id=request_id),
            tools_json=tools_json,
            tool_choice=tool_choice,
        )
        self._requests.put_nowait(Request(start=start))
        # A DeadlineStub gives the call the request's remaining time.
        self._call = stub.ParseToolCallsStream(self._request_iterator())
        self.done = False

    async def _request_iterator(self):  # type: ignore[no-untyped-def]
        while True:
            item = await self._requests.get()
            if item is None:
                return
            yield item

    async def feed(
        self, text: str, token_ids: Sequence[int], *, finished: bool
    ) -> tokenizer_pb2.ParseToolCallsStreamResponse:
        """What this delta adds (content, tool-call deltas); `finished`: the sequence's last."""
        delta = Request.Delta(text=text, token_ids=list(token_ids), finished=finished)
        self._requests.put_nowait(Request(delta=delta))
        try:
            response = await self._call.read()
        except grpc.aio.AioRpcError as error:
            self.done = True
            if error.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise errors.invalid(error.details() or "the tokenizer refused the tools", "tools") from error
            raise errors.ApiError(
                503,
                f"tool-call parsing failed: {error.details() or error.code().name}",
                type_="service_unavailable",
            ) from error
        if response is grpc.aio.EOF:
            self.done = True
            raise errors.tokenizer_unavailable("tool-call stream ended early")
        if finished:
            self.done = True
            self._requests.put_nowait(None)  # half-close: the service has answered its last
        return response

    def close(self) -> None:
        """Ends the call early (the client left, the stream failed)."""
        if not self.done:
            self.done = True
            self._requests.put_nowait(None)
            self._call.cancel()
