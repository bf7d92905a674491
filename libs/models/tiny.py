"""A tiny random-weight Llama with a real tokenizer: a model fixture that loads in milliseconds.

Generated at test time, never committed. The weights are random, so its text is gibberish,
but its shapes, tokenizer and files are those of a real model, which is what serving code
and vLLM care about.
"""

import shutil
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

TINY_LLAMA_SEED = 0


@dataclass(frozen=True)
class TinyLlamaShape:
    """Field names are LlamaConfig's."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    # vLLM's CPU attention only supports head sizes of 32 and up: 128 / 4 heads = 32.
    head_dim: int = 32
    # Fewer KV heads than query heads, so grouped-query attention paths get exercised.
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048


TINY_LLAMA_SHAPE = TinyLlamaShape()

# Whatever of these the source folder has is copied byte for byte (not re-saved through
# transformers), so the tiny model tokenizes and templates exactly like the source model.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


def make_tiny_llama(dest: Path, tokenizer_from: Path) -> Path:
    """Write a tiny deterministic bf16 Llama into `dest` (absent or empty) with the tokenizer
    of the HF folder `tokenizer_from`; returns `dest`. Same inputs give byte-identical weights.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise FileExistsError(f"make_tiny_llama needs an empty folder, {dest} is not empty")

    # Loading (not only copying) checks the tokenizer is usable and gives the vocabulary size.
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_from, local_files_only=True)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        hidden_size=TINY_LLAMA_SHAPE.hidden_size,
        intermediate_size=TINY_LLAMA_SHAPE.intermediate_size,
        num_hidden_layers=TINY_LLAMA_SHAPE.num_hidden_layers,
        num_attention_heads=TINY_LLAMA_SHAPE.num_attention_heads,
        head_dim=TINY_LLAMA_SHAPE.head_dim,
        num_key_value_heads=TINY_LLAMA_SHAPE.num_key_value_heads,
        max_position_embeddings=TINY_LLAMA_SHAPE.max_position_embeddings,
    )
    # fork_rng: seeding must not change the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_LLAMA_SEED)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(dest)

    copied = [name for name in TOKENIZER_FILES if (tokenizer_from / name).is_file()]
    for name in copied:
        shutil.copyfile(tokenizer_from / name, dest / name)
    log.info("models.tiny_llama_written", dest=str(dest), tokenizer_files=copied)
    return dest
