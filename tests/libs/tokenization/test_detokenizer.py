"""IncrementalDetokenizer: deltas join to the full decode; no U+FFFD for split characters."""

import importlib.util
import itertools
import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from tokenizers import Tokenizer as RawTokenizer

from libs.tokenization.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer
from libs.tokenization.tokenizer import Tokenizer

TEXTS = {
    "ascii": "Hello world! The quick brown fox, 42 times.",
    "emoji": "🇫🇷👍🏽",
    "cjk": "東京は日本の首都です",
    "mixed": "Grüße aus Москва — 東京 🚀 naïve café, مرحبا بالعالم! नमस्ते 👨‍👩‍👧",
    "spaces": "  leading,\ttabs\nand\n\nnewlines  ",
}
CHUNK_SIZES = [1, 2, 3, 5, 1000]
# Characters the random-text test draws from: 1- to 4-byte UTF-8 and ZWJ.
ALPHABET = "ab Z,.\n\téü€Жж東京日本語字🙂👍🏽🇫🇷\u200d"


@pytest.fixture(params=["smollm2", "byte_fallback"])
def tokenizer(request: pytest.FixtureRequest) -> Tokenizer:
    fixture: Tokenizer = request.getfixturevalue(request.param)
    return fixture


def _chunks(ids: Sequence[int], size: int) -> list[list[int]]:
    return [list(ids[i : i + size]) for i in range(0, len(ids), size)]


def _random_chunks(ids: Sequence[int], rng: random.Random) -> list[list[int]]:
    chunks: list[list[int]] = []
    i = 0
    while i < len(ids):
        size = rng.randint(1, 4)
        chunks.append(list(ids[i : i + size]))
        i += size
    return chunks


def _stream(detok: IncrementalDetokenizer, chunks: Sequence[Sequence[int]]) -> tuple[list[str], str]:
    """Returns (the feed() deltas, the flush() remainder)."""
    return [detok.feed(chunk) for chunk in chunks], detok.flush()


@pytest.mark.parametrize("name", sorted(TEXTS))
@pytest.mark.parametrize("size", CHUNK_SIZES)
def test_deltas_join_to_full_decode(tokenizer: Tokenizer, name: str, size: int) -> None:
    ids = tokenizer.encode(TEXTS[name], add_special_tokens=False)
    deltas, rest = _stream(IncrementalDetokenizer(tokenizer), _chunks(ids, size))
    full = tokenizer.decode(ids)
    assert "".join(deltas) == full
    # SentencePiece decoding drops one leading space; that is the tokenizer's.
    assert full.strip() == TEXTS[name].strip()
    # Whole characters: the stream itself was exact, flush had nothing left.
    assert rest == ""
    assert not any(REPLACEMENT_CHAR in delta for delta in deltas)


def test_split_characters_are_really_exercised(smollm2: Tokenizer, byte_fallback_dir: Path) -> None:
    # Guards the tests above: single tokens of these texts are partial UTF-8.
    for text in (TEXTS["emoji"], TEXTS["cjk"]):
        ids = smollm2.encode(text, add_special_tokens=False)
        assert any(REPLACEMENT_CHAR in smollm2.decode([i]) for i in ids)
    raw = RawTokenizer.from_file(str(byte_fallback_dir / "tokenizer.json"))
    tokens = raw.encode(TEXTS["emoji"], add_special_tokens=False).tokens
    assert "<0xF0>" in tokens
    assert "<0x9F>" in tokens


@pytest.mark.parametrize("text", ["é", "東", "👍"])
def test_incomplete_character_held_until_complete(byte_fallback: Tokenizer, text: str) -> None:
    ids = byte_fallback.encode("a" + text, add_special_tokens=False)
    detok = IncrementalDetokenizer(byte_fallback)
    deltas = [detok.feed([token_id]) for token_id in ids]
    # One byte token per UTF-8 byte (2, 3, 4 of them): nothing of the
    # character comes out until its last byte.
    assert deltas[-1].endswith(text)
    assert "".join(deltas[:-1]) == "a"
    assert detok.flush() == ""


def test_text_before_an_incomplete_character_is_not_held(smollm2: Tokenizer) -> None:
    ids = smollm2.encode("Hello 👍", add_special_tokens=False)
    detok = IncrementalDetokenizer(smollm2)
    # Feed everything but the emoji's last token in one chunk.
    assert detok.feed(ids[:-1]) == "Hello "
    assert detok.feed(ids[-1:]) == "👍"


def test_random_valid_text_random_chunks(tokenizer: Tokenizer) -> None:
    rng = random.Random(7)
    for _ in range(150):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 30)))
        ids = tokenizer.encode(text, add_special_tokens=False)
        deltas, rest = _stream(IncrementalDetokenizer(tokenizer), _random_chunks(ids, rng))
        full = tokenizer.decode(ids)
        assert "".join(deltas) + rest == full, text
        if not full.endswith(REPLACEMENT_CHAR):
            assert rest == ""
            assert not any(REPLACEMENT_CHAR in delta for delta in deltas), text


def _check_random_ids(tokenizer: Tokenizer, ids: list[int], chunks: list[list[int]], skip: bool) -> None:
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip)
    deltas, rest = _stream(detok, chunks)
    full = tokenizer.decode(ids, skip_special_tokens=skip)
    assert "".join(deltas) + rest == full
    # Held-back text only ever ends in what could be an incomplete character.
    assert not any(delta.endswith(REPLACEMENT_CHAR) for delta in deltas)


@pytest.mark.parametrize("skip", [True, False])
def test_random_token_ids_seeded(smollm2: Tokenizer, skip: bool) -> None:
    # Arbitrary ids include special tokens and invalid UTF-8 byte sequences;
    # byte-level decoding is prefix-stable on them, so the stream stays exact.
    rng = random.Random(2024)
    for _ in range(300):
        ids = [rng.randrange(smollm2.vocab_size) for _ in range(rng.randint(1, 40))]
        _check_random_ids(smollm2, ids, _random_chunks(ids, rng), skip)


def test_random_byte_tokens_seeded(smollm2: Tokenizer) -> None:
    # Ids whose tokens are single raw bytes (ByteLevel alphabet) hit partial
    # and invalid UTF-8 far more often than uniformly drawn ids.
    byte_ids = [i for i in range(smollm2.vocab_size) if len(smollm2.decode([i]).encode()) <= 3]
    rng = random.Random(99)
    for _ in range(300):
        ids = [rng.choice(byte_ids) for _ in range(rng.randint(1, 30))]
        _check_random_ids(smollm2, ids, _random_chunks(ids, rng), True)


if importlib.util.find_spec("hypothesis") is not None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(
        max_examples=200,
        deadline=None,
        database=None,  # no .hypothesis/ folder written into the checkout
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(data=st.data())
    def test_random_token_ids_property(smollm2: Tokenizer, data: st.DataObject) -> None:
        ids = data.draw(st.lists(st.integers(0, smollm2.vocab_size - 1), min_size=1, max_size=40))
        cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=8))
        bounds = sorted(set(cuts) | {0, len(ids)})
        chunks = [ids[i:j] for i, j in itertools.pairwise(bounds)]
        _check_random_ids(smollm2, ids, chunks, data.draw(st.booleans()))


def test_skip_special_tokens(smollm2: Tokenizer) -> None:
    ids = smollm2.encode("Hi there<|im_end|>", add_special_tokens=False)
    assert ids[-1] in smollm2.eos_token_ids
    deltas, rest = _stream(IncrementalDetokenizer(smollm2), _chunks(ids, 1))
    assert "".join(deltas) + rest == "Hi there"
    keep = IncrementalDetokenizer(smollm2, skip_special_tokens=False)
    deltas, rest = _stream(keep, _chunks(ids, 1))
    assert "".join(deltas) + rest == "Hi there<|im_end|>"


def test_context_ids_keep_the_leading_space(byte_fallback: Tokenizer) -> None:
    prompt = byte_fallback.encode("Hello", add_special_tokens=True)
    full = byte_fallback.encode("Hello world", add_special_tokens=True)
    generated = full[len(prompt) :]
    assert full[: len(prompt)] == prompt
    # Alone, a SentencePiece decoder strips the first token's space ...
    alone = IncrementalDetokenizer(byte_fallback)
    assert "".join(d for d in _stream(alone, _chunks(generated, 1))[0]) == "world"
    # ... after the prompt it is part of the text.
    detok = IncrementalDetokenizer(byte_fallback, context_ids=prompt)
    deltas, rest = _stream(detok, _chunks(generated, 1))
    assert ("".join(deltas), rest) == (" world", "")
    assert detok.num_tokens == len(generated)


def test_empty_feed_and_feed_after_flush(smollm2: Tokenizer) -> None:
    detok = IncrementalDetokenizer(smollm2)
    assert detok.feed([]) == ""
    assert detok.flush() == ""
    assert detok.flush() == ""
    with pytest.raises(RuntimeError):
        detok.feed([42])


def test_invalid_byte_run_keeps_already_emitted_character(
    byte_fallback: Tokenizer, byte_fallback_dir: Path
) -> None:
    # The documented trade-off: "東" is emitted once complete; a stray 0xF0
    # byte token after it makes ByteFallback rewrite the whole run as U+FFFDs,
    # which the stream cannot take back.
    raw = RawTokenizer.from_file(str(byte_fallback_dir / "tokenizer.json"))

    def byte_id(byte: int) -> int:
        token_id = raw.token_to_id(f"<0x{byte:02X}>")
        assert token_id is not None
        return token_id

    east = [byte_id(byte) for byte in "東".encode()]
    stray = byte_id(0xF0)
    word = byte_fallback.encode("Hello", add_special_tokens=False)
    detok = IncrementalDetokenizer(byte_fallback)
    assert detok.feed(east) == "東"
    assert detok.feed([stray]) == ""
    rest = "".join(detok.feed([i]) for i in word) + detok.flush()
    assert rest.endswith("Hello")
    assert byte_fallback.decode([*east, stray, *word]).startswith(REPLACEMENT_CHAR * 4)
