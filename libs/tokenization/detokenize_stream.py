"""The DetokenizeStream protocol: a `start`, then `tokens` batches and a `finish`, each answered
by exactly one response; the stream ends with the first `complete` or `error`. The text work
is session.py's.

Protocol errors before the stream starts (no or a bad `start`) are raised, so the call ends
with INVALID_ARGUMENT before any response; once started, an error is the stream's typed
`error` response (the contract promises complete-or-error).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

import structlog

from cleave.tokenizer.v1 import tokenizer_pb2
from libs.rpc import errors
from libs.rpc.errors import InvalidRequest
from libs.tokenization.decoder import Decoder
from libs.tokenization.session import DetokenizeSession
from libs.tokenization.stream_protocol import bind_request, first_start

log = structlog.get_logger(__name__)

Request = tokenizer_pb2.DetokenizeStreamRequest
Response = tokenizer_pb2.DetokenizeStreamResponse
METHOD = "DetokenizeStream"


async def detokenize_stream(
    tokenizer: Decoder, requests: AsyncIterator[Request], *, service: str
) -> AsyncGenerator[Response, None]:
    """`service`: the serving service's name, for the error message of a bug (libs.rpc.errors)."""
    requests = aiter(requests)
    start = (await first_start(requests)).start
    bind_request(start.metadata)
    session = DetokenizeSession(tokenizer, start)
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
            yield Response(error=errors.stream_error(error, service=service, method=METHOD))
            return
        yield response
        if session.done:
            # A stop string or `finish` ended the text; later input has nothing to add.
            log.debug("detokenize stream done", num_tokens=session.num_tokens)
            return


async def _finish_at_end(requests: AsyncIterator[Request]) -> AsyncIterator[Request]:
    """A client that half-closes without `finish` means the same: the engine is done."""
    async for request in requests:
        yield request
    yield Request(finish=True)
