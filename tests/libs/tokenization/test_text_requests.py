"""Tokenize and Detokenize without gRPC: ids and each token's own text; ids outside the
vocabulary are the caller's mistake."""

from __future__ import annotations

import pytest

from cleave.tokenizer.v1 import tokenizer_pb2 as pb
from libs.rpc.errors import InvalidRequest
from libs.tokenization.text_requests import detokenize, tokenize
from libs.tokenization.tokenizer import Tokenizer


def test_tokenize_gives_ids_and_on_request_each_tokens_text(smollm2: Tokenizer) -> None:
    plain = tokenize(smollm2, pb.TokenizeRequest(text="Hello world"))
    assert list(plain.token_ids) == smollm2.encode("Hello world", add_special_tokens=False)
    assert not plain.token_strs
    with_strs = tokenize(smollm2, pb.TokenizeRequest(text="Hello world", return_token_strs=True))
    assert "".join(with_strs.token_strs) == "Hello world"


def test_detokenize_round_trips_and_refuses_foreign_ids(smollm2: Tokenizer) -> None:
    ids = smollm2.encode("Hello world", add_special_tokens=False)
    assert detokenize(smollm2, pb.DetokenizeRequest(token_ids=ids)).text == "Hello world"
    with pytest.raises(InvalidRequest, match=r"token_ids\[0\] = -1"):
        detokenize(smollm2, pb.DetokenizeRequest(token_ids=[-1]))
