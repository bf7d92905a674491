"""Tokenizer: loading from a local folder, encode/decode, vocab and special ids."""

import json
import shutil
from pathlib import Path

import pytest

from libs.tokenization.tokenizer import Tokenizer, TokenizerConfig


def test_smollm2_facts(smollm2: Tokenizer) -> None:
    assert smollm2.vocab_size == 49152
    assert smollm2.eos_token_ids == (2,)  # <|im_end|>
    assert smollm2.bos_token_id == 1  # <|im_start|>
    assert smollm2.has_chat_template


def test_encode_decode_roundtrip(smollm2: Tokenizer) -> None:
    text = "Hello world! 東京 🚀"
    ids = smollm2.encode(text, add_special_tokens=False)
    assert all(isinstance(i, int) and 0 <= i < smollm2.vocab_size for i in ids)
    assert smollm2.decode(ids) == text


def test_special_tokens_encode_and_decode(smollm2: Tokenizer) -> None:
    ids = smollm2.encode("<|im_start|>user\nHi<|im_end|>", add_special_tokens=False)
    assert ids[0] == 1
    assert ids[-1] == 2
    assert smollm2.decode(ids, skip_special_tokens=True) == "user\nHi"
    assert smollm2.decode(ids) == "<|im_start|>user\nHi<|im_end|>"


def test_add_special_tokens_adds_bos(byte_fallback: Tokenizer) -> None:
    assert byte_fallback.bos_token_id == 1
    with_bos = byte_fallback.encode("Hello", add_special_tokens=True)
    without = byte_fallback.encode("Hello", add_special_tokens=False)
    assert with_bos == [1, *without]
    assert byte_fallback.eos_token_ids == (2,)
    assert not byte_fallback.has_chat_template


@pytest.mark.parametrize(("extra", "expected"), [([2, 0], (2, 0)), (0, (2, 0)), (2, (2,))])
def test_eos_ids_from_generation_config(
    smollm2_dir: Path, tmp_path: Path, extra: int | list[int], expected: tuple[int, ...]
) -> None:
    folder = tmp_path / "model"
    shutil.copytree(smollm2_dir, folder)
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": extra}))
    tokenizer = Tokenizer.from_config(TokenizerConfig(path=folder))
    assert tokenizer.eos_token_ids == expected


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Tokenizer.from_config(TokenizerConfig(path=tmp_path / "nope"))


def test_folder_without_tokenizer(tmp_path: Path) -> None:
    # Must fail locally rather than fall back to downloading anything.
    with pytest.raises(ValueError, match="cannot load a tokenizer"):
        Tokenizer.from_config(TokenizerConfig(path=tmp_path))
