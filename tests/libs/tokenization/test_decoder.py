"""BackendDecoder (the decoder the tokenizer service hands the gateway) decodes as Tokenizer."""

import random

import pytest
from transformers import PreTrainedTokenizerFast

from libs.tokenization.decoder import BackendDecoder
from libs.tokenization.detokenizer import IncrementalDetokenizer
from libs.tokenization.tokenizer import Tokenizer

TEXT = "Grüße aus Москва — 東京 🚀 naïve café!<|im_end|> 👨‍👩‍👧  tabs\tand\n\nnewlines"


@pytest.fixture(params=["smollm2", "byte_fallback"])
def tokenizer(request: pytest.FixtureRequest) -> Tokenizer:
    fixture: Tokenizer = request.getfixturevalue(request.param)
    return fixture


def _decoder(tokenizer: Tokenizer) -> BackendDecoder:
    tokenizer_json = tokenizer.decoder_json()
    assert tokenizer_json is not None
    return BackendDecoder.from_json(tokenizer_json, tokenizer.vocab_size)


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_every_window_decodes_as_the_tokenizer(tokenizer: Tokenizer, skip_special_tokens: bool) -> None:
    decoder = _decoder(tokenizer)
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    rng = random.Random(0)
    windows = [ids[i : i + n] for i in range(len(ids)) for n in (1, 2, 5)]
    windows += [[rng.randrange(tokenizer.vocab_size) for _ in range(8)] for _ in range(200)]
    for window in windows:
        expected = tokenizer.decode(window, skip_special_tokens=skip_special_tokens)
        assert decoder.decode(window, skip_special_tokens=skip_special_tokens) == expected
    assert decoder.vocab_size == tokenizer.vocab_size


def test_streams_are_the_same(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    local = IncrementalDetokenizer(_decoder(tokenizer), context_ids=ids[:3])
    remote = IncrementalDetokenizer(tokenizer, context_ids=ids[:3])
    assert [local.feed([t]) for t in ids[3:]] == [remote.feed([t]) for t in ids[3:]]
    assert local.flush() == remote.flush()


def test_the_hf_decode_is_what_the_fast_path_replaces(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    hf = tokenizer._hf  # transformers' own decode, as before the fast path
    for skip in (True, False):
        assert tokenizer.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)


def test_no_decoder_when_decoding_needs_transformers(smollm2: Tokenizer) -> None:
    hf = smollm2._hf
    assert isinstance(hf, PreTrainedTokenizerFast)
    cleaned = Tokenizer(
        PreTrainedTokenizerFast(tokenizer_object=hf.backend_tokenizer, clean_up_tokenization_spaces=True),
        eos_token_ids=smollm2.eos_token_ids,
        chat_template=None,
        source="test",
    )
    assert cleaned.decoder_json() is None
