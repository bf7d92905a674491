"""GetInfo and GetDecoder: what the tokenizer service tells its clients about its tokenizer
(the gateway's limits and stop tokens; the decoder it detokenizes with in its own process)."""

from __future__ import annotations

from cleave.tokenizer.v1 import tokenizer_pb2
from libs.tokenization.tokenizer import Tokenizer


def tokenizer_info(tokenizer: Tokenizer, *, model: str, max_model_len: int) -> tokenizer_pb2.TokenizerInfo:
    return tokenizer_pb2.TokenizerInfo(
        model=model,
        vocab_size=tokenizer.vocab_size,
        eos_token_ids=tokenizer.eos_token_ids,
        bos_token_id=tokenizer.bos_token_id,  # None leaves the optional field unset
        max_model_len=max_model_len,
        has_chat_template=tokenizer.has_chat_template,
    )


def decoder_spec(tokenizer: Tokenizer) -> tokenizer_pb2.DecoderSpec:
    """The tokenizer's JSON where decoding it alone gives transformers' text ("" where not:
    the client keeps DetokenizeStream)."""
    return tokenizer_pb2.DecoderSpec(
        tokenizer_json=tokenizer.decoder_json() or "", vocab_size=tokenizer.vocab_size
    )
