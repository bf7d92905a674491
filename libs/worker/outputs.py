"""Engine outputs in the Worker contract's terms: finish reasons and logprobs as the
PrefillResponse and the Generate stream carry them."""

from __future__ import annotations

from cleave.common.v1 import common_pb2
from libs.worker.engine import TokenLogprob

# vLLM's finish reasons; "error" never reaches a message (the service raises for it).
FINISH_REASONS = {
    "stop": common_pb2.FINISH_REASON_STOP,
    "length": common_pb2.FINISH_REASON_LENGTH,
    "abort": common_pb2.FINISH_REASON_ABORT,
}


def logprob_proto(logprob: TokenLogprob) -> common_pb2.TokenLogprob:
    return common_pb2.TokenLogprob(
        token_id=logprob.token_id,
        logprob=logprob.logprob,
        rank=logprob.rank,
        top=[common_pb2.TopLogprob(token_id=t.token_id, logprob=t.logprob, rank=t.rank) for t in logprob.top],
    )


def prompt_logprobs_proto(entries: tuple[TokenLogprob | None, ...]) -> list[common_pb2.TokenLogprob]:
    # The first prompt token has no logprob; the contract marks it with an empty entry.
    return [common_pb2.TokenLogprob() if e is None else logprob_proto(e) for e in entries]
