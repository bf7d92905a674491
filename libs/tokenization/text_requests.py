"""Tokenize and Detokenize: a whole text to token ids and back, as the tokenizer service
answers them (on a pool thread, offload.py)."""

from __future__ import annotations

from cleave.tokenizer.v1 import tokenizer_pb2
from libs.tokenization.session import check_token_ids
from libs.tokenization.tokenizer import Tokenizer


def tokenize(tokenizer: Tokenizer, request: tokenizer_pb2.TokenizeRequest) -> tokenizer_pb2.TokenizeResponse:
    token_ids = tokenizer.encode(request.text, add_special_tokens=request.add_special_tokens)
    # Each token decoded on its own (special tokens kept): readable text, where vLLM's
    # convert_ids_to_tokens would show byte-level forms like "Ġhello". A token holding
    # part of a multi-byte character decodes to U+FFFD.
    if not request.return_token_strs:
        return tokenizer_pb2.TokenizeResponse(token_ids=token_ids)
    token_strs = [tokenizer.decode([token_id]) for token_id in token_ids]
    return tokenizer_pb2.TokenizeResponse(token_ids=token_ids, token_strs=token_strs)


def detokenize(
    tokenizer: Tokenizer, request: tokenizer_pb2.DetokenizeRequest
) -> tokenizer_pb2.DetokenizeResponse:
    token_ids = list(request.token_ids)
    check_token_ids(token_ids, tokenizer.vocab_size, "token_ids")
    text = tokenizer.decode(token_ids, skip_special_tokens=request.skip_special_tokens)
    return tokenizer_pb2.DetokenizeResponse(text=text)
