"""What each soak request is: chat or completion, streamed or not, how many tokens, and
whether (and when) the client walks away from it. Drawn from a seeded random.Random so that
a run can be repeated."""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from typing import Any

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "wizards",
    "quietly",
    "judge",
    "boxing",
    "matches",
    "in",
    "the",
    "old",
    "city",
    "of",
    "Paris",
    "near",
    "rivers",
    "bridges",
    "markets",
    "and",
    "small",
    "cafes",
    "where",
    "people",
    "read",
    "papers",
    "drink",
    "coffee",
    "and",
    "talk",
    "about",
    "weather",
    "music",
    "science",
    "history",
    "art",
]


class Ending(enum.Enum):
    FULL = "full"  # read to the end
    ABORT_MID_STREAM = "abort_mid_stream"  # close the connection after some chunks
    DISCONNECT_EARLY = "disconnect_early"  # give up before the answer starts (queue, prefill)


@dataclass(frozen=True)
class Mix:
    nonstream: float = 0.2
    abort_mid_stream: float = 0.25
    disconnect_early: float = 0.1
    max_tokens: int = 48
    max_prompt_words: int = 120


@dataclass(frozen=True)
class Scenario:
    path: str
    body: dict[str, Any]
    ending: Ending
    abort_after_chunks: int = 0  # ABORT_MID_STREAM: chunks read before closing
    disconnect_after_s: float = 0.0  # DISCONNECT_EARLY: how long the client waits

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def kind(self) -> str:
        api = "chat" if self.path.endswith("chat/completions") else "completions"
        return f"{api}/{'stream' if self.stream else 'unary'}"


def draw(rng: random.Random, model: str, mix: Mix) -> Scenario:
    chat = rng.random() < 0.5
    prompt = " ".join(rng.choices(WORDS, k=rng.randint(1, mix.max_prompt_words)))
    max_tokens = rng.randint(1, mix.max_tokens)
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": rng.choice([0, 0.7, 1.0]),
    }
    if chat:
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        path = "/v1/completions"
        body["prompt"] = prompt
    roll = rng.random()
    if roll < mix.nonstream:
        body["stream"] = False
        if body["temperature"] > 0 and rng.random() < 0.3:  # greedy allows only n=1
            body["n"] = 2
        return Scenario(path, body, Ending.FULL)
    body["stream"] = True
    if rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    roll -= mix.nonstream
    if roll < mix.abort_mid_stream:
        return Scenario(path, body, Ending.ABORT_MID_STREAM, abort_after_chunks=rng.randint(1, max_tokens))
    roll -= mix.abort_mid_stream
    if roll < mix.disconnect_early:
        return Scenario(path, body, Ending.DISCONNECT_EARLY, disconnect_after_s=rng.uniform(0.01, 2.0))
    return Scenario(path, body, Ending.FULL)
