"""One DetokenizeStream per generated sequence: token ids in, text deltas out, stop strings
detected by the tokenizer service across token boundaries.

Failures of the stream are the tokenizer's (or, when it refuses the request, the client's) and
surface as `errors.ApiError`, never as a gRPC error the pipeline would blame on the worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
import grpc.aio

from cleave.common.v1 import common_pb2
from cleave.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from libs.gateway.common import errors
from libs.gateway.common.deadline import NO_DEADLINE, Deadline


@dataclass(frozen=True)
class DetokenizedText:
    text: str
    stopped: bool = False  # a stop string matched: the sequence is over
    matched_stop: str = ""  # which one (vLLM's stop_reason)
    complete: bool = False


class SequenceDetokenizer:
    def __init__(
        self,
        stub: tokenizer_pb2_grpc.TokenizerStub,
        *,
        request_id: str,
        prompt_tail: Sequence[int],
        stops: Sequence[str],
        skip_special_tokens: bool = True,
        include_stop_str_in_output: bool = False,
        deadline: Deadline = NO_DEADLINE,
    ) -> None:
        self._requests: asyncio.Queue[tokenizer_pb2.DetokenizeStreamRequest | None] = asyncio.Queue()
        start = tokenizer_pb2.DetokenizeStart(
            metadata=common_pb2.RequestMetadata(request_id=request_id),
            prompt_tail_token_ids=list(prompt_tail),
            stop=list(stops),
            skip_special_tokens=skip_special_tokens,
            include_stop_str_in_output=include_stop_str_in_output,
        )
        self._requests.put_nowait(tokenizer_pb2.DetokenizeStreamRequest(start=start))
        # The request's deadline bounds the stream: it ends with the request's time.
        self._deadline = deadline
        self._call = stub.DetokenizeStream(self._request_iterator(), timeout=deadline.grpc_timeout())
        self.done = False

    async def _request_iterator(self):  # type: ignore[no-untyped-def]
        while True:
            item = await self._requests.get()
            if item is None:
                return
            yield item

    async def feed(self, token_ids: Sequence[int]) -> DetokenizedText:
        """Text for these tokens (possibly empty while held back)."""
        self._requests.put_nowait(
            tokenizer_pb2.DetokenizeStreamRequest(tokens=tokenizer_pb2.TokenBatch(token_ids=token_ids))
        )
        return await self._read()

    async def finish(self) -> DetokenizedText:
        """Flushes held-back text at the end of the sequence."""
        self._requests.put_nowait(tokenizer_pb2.DetokenizeStreamRequest(finish=True))
        return await self._read()

    async def _read(self) -> DetokenizedText:
        try:
            response = await self._call.read()
        except grpc.aio.AioRpcError as error:
            self.done = True
            if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and self._deadline.expired():
                raise self._deadline.exceeded() from error
            if error.code() == grpc.StatusCode.INVALID_ARGUMENT:
                # Refused at `start`: the client's stop strings or prompt.
                raise errors.invalid(error.details() or "the tokenizer refused the request") from error
            raise errors.tokenizer_unavailable(f"detokenize stream failed: {error.code().name}") from error
        if response is grpc.aio.EOF:
            self.done = True
            raise errors.tokenizer_unavailable("detokenize stream ended without a complete message")
        kind = response.WhichOneof("kind")
        if kind == "delta":
            return DetokenizedText(response.delta.text)
        self.done = True
        self._requests.put_nowait(None)
        if kind == "complete":
            complete = response.complete
            return DetokenizedText(
                complete.text, stopped=complete.stopped, matched_stop=complete.matched_stop, complete=True
            )
        # Refused mid-stream: the output tokens, which came from the engine, not the client.
        raise errors.ApiError(
            500, f"tokenizer error: {response.error.message}", type_="server_error", code="tokenizer_error"
        )

    def close(self) -> None:
        self._requests.put_nowait(None)
        self._call.cancel()
