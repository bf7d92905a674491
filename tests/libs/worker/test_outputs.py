"""Engine logprobs and finish reasons as the Worker contract carries them."""

from __future__ import annotations

from cleave.common.v1 import common_pb2
from libs.worker.engine import TokenLogprob, TopLogprob
from libs.worker.outputs import FINISH_REASONS, logprob_proto, prompt_logprobs_proto

CHOSEN = TokenLogprob(token_id=7, logprob=-0.5, rank=1, top=(TopLogprob(token_id=7, logprob=-0.5, rank=1),))


def test_a_logprob_keeps_its_token_rank_and_top_entries() -> None:
    message = logprob_proto(CHOSEN)
    assert (message.token_id, message.logprob, message.rank) == (7, -0.5, 1)
    assert [(t.token_id, t.rank) for t in message.top] == [(7, 1)]


def test_the_first_prompt_token_has_an_empty_entry() -> None:
    first, second = prompt_logprobs_proto((None, CHOSEN))
    assert first == common_pb2.TokenLogprob() and second.token_id == 7


def test_vllms_finish_reasons_map_onto_the_contracts() -> None:
    assert FINISH_REASONS == {
        "stop": common_pb2.FINISH_REASON_STOP,
        "length": common_pb2.FINISH_REASON_LENGTH,
        "abort": common_pb2.FINISH_REASON_ABORT,
    }
