"""Decoding token ids on a Hugging Face `tokenizers` tokenizer alone, without transformers.

The tokenizer service hands its own tokenizer's JSON to callers that detokenize streams in
their own process (the gateway; `Tokenizer.GetDecoder`), so the per-token path needs no gRPC
round trip. It is offered only where transformers' decode is exactly the Rust tokenizer's
(`Tokenizer.decoder_json`), so both give the same text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tokenizers import Tokenizer as RustTokenizer


class Decoder(Protocol):
    """What incremental detokenization needs of a tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...


class BackendDecoder:
    def __init__(self, backend: RustTokenizer, vocab_size: int) -> None:
        self._backend = backend
        self._vocab_size = vocab_size

    @classmethod
    def from_json(cls, tokenizer_json: str, vocab_size: int) -> BackendDecoder:
        return cls(RustTokenizer.from_str(tokenizer_json), vocab_size)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
