"""One DetokenizeStream: token id batches in, text deltas (stop strings applied) out.

Kept free of gRPC so the tokenizer service's servicer only deals with the stream protocol
(first message, half-close, error replies) and this module only with text. The gateway runs
the same sessions in-process when the tokenizer service offers its decoder (GetDecoder), so
both paths give the same text by construction.
"""

from __future__ import annotations

from collections.abc import Sequence

from cleave.tokenizer.v1 import tokenizer_pb2
from libs.rpc.errors import InvalidRequest
from libs.tokenization.decoder import Decoder
from libs.tokenization.detokenizer import IncrementalDetokenizer
from libs.tokenization.stop import StopStringMatcher

Response = tokenizer_pb2.DetokenizeStreamResponse


def check_token_ids(token_ids: Sequence[int], vocab_size: int, field: str) -> None:
    """Refuses ids the tokenizer cannot decode.

    HF decoding silently drops ids past the vocabulary and raises OverflowError on
    negative ones; either would hide an engine/tokenizer mismatch, so say so instead.
    """
    for index, token_id in enumerate(token_ids):
        if not 0 <= token_id < vocab_size:
            raise InvalidRequest(
                f"{field}[{index}] = {token_id} is not a token id of this tokenizer "
                f"(expected 0..{vocab_size - 1})"
            )


def _delta(text: str, num_tokens: int) -> Response:
    return Response(delta=tokenizer_pb2.TextDelta(text=text, num_tokens=num_tokens))


def _complete(text: str, num_tokens: int, matched_stop: str | None = None) -> Response:
    return Response(
        complete=tokenizer_pb2.DetokenizeComplete(
            stopped=matched_stop is not None,
            matched_stop=matched_stop or "",
            text=text,
            num_tokens=num_tokens,
        )
    )


class DetokenizeSession:
    """Turns each batch into one response; `done` once `complete` has been produced."""

    def __init__(self, tokenizer: Decoder, start: tokenizer_pb2.DetokenizeStart) -> None:
        self._vocab_size = tokenizer.vocab_size
        tail = list(start.prompt_tail_token_ids)
        check_token_ids(tail, self._vocab_size, "start.prompt_tail_token_ids")
        try:
            self._stops = StopStringMatcher(list(start.stop), start.include_stop_str_in_output)
        except ValueError as error:
            raise InvalidRequest(f"start.stop: {error}") from error
        self._has_stops = len(start.stop) > 0
        self._detokenizer = IncrementalDetokenizer(
            tokenizer, skip_special_tokens=start.skip_special_tokens, context_ids=tail
        )
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    @property
    def num_tokens(self) -> int:
        return self._detokenizer.num_tokens

    def feed(self, token_ids: Sequence[int]) -> Response:
        """One batch -> one response: a delta (maybe empty text), or `complete` at a stop string."""
        self._check_open()
        check_token_ids(token_ids, self._vocab_size, "tokens.token_ids")
        if not self._has_stops:
            return _delta(self._detokenizer.feed(token_ids), self.num_tokens)
        # With stop strings, feed token by token: the token that completes a stop is where a
        # token-by-token engine (vLLM) would have stopped, so num_tokens then counts exactly
        # the tokens the text accounts for, and tokens after it in the batch are not consumed.
        parts: list[str] = []
        for token_id in token_ids:
            result = self._stops.process(self._detokenizer.feed([token_id]))
            parts.append(result.text)
            if result.stopped:
                return self._complete("".join(parts), result.matched_stop or "")
        return _delta("".join(parts), self.num_tokens)

    def finish(self) -> Response:
        """The engine is done: `complete` with the held-back text."""
        self._check_open()
        # The detokenizer's held bytes can still complete a stop string.
        result = self._stops.process(self._detokenizer.flush())
        if result.stopped:
            return self._complete(result.text, result.matched_stop or "")
        return self._complete(result.text + self._stops.flush(), None)

    def _complete(self, text: str, matched_stop: str | None) -> Response:
        self._done = True
        return _complete(text, self.num_tokens, matched_stop)

    def _check_open(self) -> None:
        if self._done:
            raise RuntimeError("the stream is already complete")
