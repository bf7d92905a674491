"""Twenty varied prompts for the end-to-end equivalence checks: short, long (~1,500 tokens),
multilingual, emoji, and one raw completion prompt. Long ones differ from their first token
so no two prompts share a cached prefix block."""

from __future__ import annotations

import random

from libs.tokenization.chat import ChatMessage
from libs.tokenization.tokenizer import Tokenizer

CHAT = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "What is 17 times 23?",
    "List three primary colors.",
    "Explain photosynthesis in one sentence.",
    "Hi",
    "Quelle est la capitale de l'Allemagne ?",
    "¿Cuál es el río más largo del mundo?",
    "Erkläre kurz, was ein Computer ist.",
    "请用一句话介绍长城。",
    "東京について短く教えてください。",
    "Что такое фотосинтез?",
    "ما هي عاصمة مصر؟",
    "Translate these emoji into words: 🇫🇷👍🏽🍕🎉",
    "What does the emoji ❤️‍🔥 usually mean? Answer with emoji too 😀",
]
RAW = ["The quick brown fox jumps over the lazy dog. Then the fox"]
_WORDS = [
    "river",
    "mountain",
    "engine",
    "signal",
    "harvest",
    "lantern",
    "copper",
    "meadow",
    "theory",
    "orbit",
    "canvas",
    "harbor",
    "glacier",
    "violin",
    "archive",
    "compass",
    "market",
    "thunder",
    "pepper",
    "castle",
    "garden",
    "mirror",
    "planet",
    "ladder",
    "forest",
    "circuit",
    "saddle",
    "marble",
    "tunnel",
    "feather",
    "anchor",
    "basket",
    "candle",
    "desert",
    "island",
    "jacket",
]
LONG_TOPICS = ["astronomy", "cooking", "railways", "music"]


def long_text(topic: str, seed: int, words: int = 1400) -> str:
    rng = random.Random(seed)
    body = " ".join(rng.choice(_WORDS) for _ in range(words))
    return f"Notes on {topic} #{seed}: {body}\n\nSummarize the notes above in one sentence."


def build_prompts(tokenizer: Tokenizer) -> list[tuple[str, list[int]]]:
    prompts = []
    for text in CHAT:
        rendered = tokenizer.render_chat([ChatMessage(role="user", content=text)])
        prompts.append((text[:40], tokenizer.encode(rendered, add_special_tokens=False)))
    for i, topic in enumerate(LONG_TOPICS):
        rendered = tokenizer.render_chat([ChatMessage(role="user", content=long_text(topic, seed=i))])
        prompts.append((f"long {topic}", tokenizer.encode(rendered, add_special_tokens=False)))
    for text in RAW:
        prompts.append((text[:40], tokenizer.encode(text, add_special_tokens=False)))
    return prompts


def shared_prefix(tokenizer: Tokenizer, seed: int, tokens: int) -> list[int]:
    """`tokens` token ids of seeded random notes: a long shared context (system prompt, document)."""
    rng = random.Random(seed)
    text = f"Reference notes #{seed}: " + " ".join(rng.choice(_WORDS) for _ in range(3 * tokens))
    return tokenizer.encode(text)[:tokens]


def question(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(f"\n\nQuestion: {text}\nAnswer:", add_special_tokens=False)
