"""Detokenization in the gateway's own process: the same sessions the tokenizer service runs
for DetokenizeStream (libs/tokenization/session.py), on the decoder it hands out (GetDecoder).

A DetokenizeStream costs two gRPC messages per generated token in the gateway and two more in
the tokenizer service, about half a millisecond of CPU per token between them; a session here
costs tens of microseconds. The tokenizer service keeps chat templates and tokenization; a
tokenizer service that does not offer its decoder (an older one, or a tokenizer whose decoding
needs transformers) keeps the stream (`load_decoder` returns None).
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import grpc.aio
import structlog

from cleave.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from libs.gateway.common import errors
from libs.gateway.serving.detokenize import DetokenizedText
from libs.rpc import errors as rpc_errors
from libs.rpc.errors import InvalidRequest
from libs.tokenization.decoder import BackendDecoder, Decoder
from libs.tokenization.session import DetokenizeSession

log = structlog.get_logger(__name__)
_SERVICE = "gateway-detokenizer"


async def load_decoder(stub: tokenizer_pb2_grpc.TokenizerStub, timeout_s: float = 60.0) -> Decoder | None:
    """The tokenizer service's decoder, or None: detokenize through its stream instead."""
    try:
        spec = await stub.GetDecoder(tokenizer_pb2.GetDecoderRequest(), timeout=timeout_s)
    except grpc.aio.AioRpcError as error:
        log.warning(
            "the tokenizer offers no decoder; detokenizing through its stream", code=error.code().name
        )
        return None
    if not spec.tokenizer_json:
        log.info("the tokenizer's decoding needs transformers; detokenizing through its stream")
        return None
    log.info("detokenizing in the gateway", vocab_size=spec.vocab_size)
    return BackendDecoder.from_json(spec.tokenizer_json, spec.vocab_size)


class LocalSequenceDetokenizer:
    """SequenceDetokenizer's interface and answers, without the round trip."""

    def __init__(
        self,
        decoder: Decoder,
        *,
        request_id: str,
        prompt_tail: Sequence[int],
        stops: Sequence[str],
        skip_special_tokens: bool = True,
        include_stop_str_in_output: bool = False,
    ) -> None:
        start = tokenizer_pb2.DetokenizeStart(
            prompt_tail_token_ids=list(prompt_tail),
            stop=list(stops),
            skip_special_tokens=skip_special_tokens,
            include_stop_str_in_output=include_stop_str_in_output,
        )
        del request_id  # the stream's log context; this one logs through the caller's
        self.done = False
        self._session: DetokenizeSession | None = None
        self._refused: errors.ApiError | None = None
        try:
            self._session = DetokenizeSession(decoder, start)
        except InvalidRequest as error:
            # The client's stop strings or prompt: a 400, at the first token as with the stream.
            self._refused = errors.invalid(str(error))

    async def feed(self, token_ids: Sequence[int]) -> DetokenizedText:
        """Text for these tokens (possibly empty while held back)."""
        return self._answer(token_ids)

    def feed_now(self, token_ids: Sequence[int]) -> DetokenizedText:
        """`feed` without a coroutine: it never waits (the decode stream calls it per token)."""
        return self._answer(token_ids)

    async def finish(self) -> DetokenizedText:
        """Flushes held-back text at the end of the sequence."""
        return self._answer(None)

    def _answer(self, token_ids: Sequence[int] | None) -> DetokenizedText:
        if self._refused is not None:
            self.done = True
            raise self._refused
        assert self._session is not None
        try:
            response = self._session.feed(token_ids) if token_ids is not None else self._session.finish()
        except Exception as error:
            # As the service's stream ends with an Error: the output tokens came from the engine.
            self.done = True
            message = rpc_errors.stream_error(error, service=_SERVICE, method="detokenize").message
            raise errors.ApiError(
                500, f"tokenizer error: {message}", type_="server_error", code="tokenizer_error"
            ) from error
        if response.WhichOneof("kind") == "delta":
            return DetokenizedText(response.delta.text)
        self.done = True
        complete = response.complete
        return DetokenizedText(
            complete.text, stopped=complete.stopped, matched_stop=complete.matched_stop, complete=True
        )

    def close(self) -> None:
        self.done = True
