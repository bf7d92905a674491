"""Workloads: endless, seed-deterministic streams of sessions, generated locally.

A session is one or more user turns sent one after another; every workload but `multiturn`
has one turn per session. Lengths are in words, which words.py keeps ~1 token each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from tools.bench import words
from tools.bench.config import WorkloadConfig


@dataclass(frozen=True)
class Turn:
    text: str  # the user message (chat) or the prompt's new text (completions)
    input_len: int  # words in `text`, ~ its tokens
    max_tokens: int


@dataclass(frozen=True)
class Session:
    session_id: int
    turns: tuple[Turn, ...]


def sample_length(rng: np.random.Generator, mean: int, spread: float) -> int:
    """Uniform in [mean * (1 - spread), mean * (1 + spread)], at least 1."""
    low = max(1, round(mean * (1 - spread)))
    high = max(low, round(mean * (1 + spread)))
    return int(rng.integers(low, high + 1))


def _turn(rng: np.random.Generator, config: WorkloadConfig, input_mean: int) -> Turn:
    input_len = sample_length(rng, input_mean, config.len_spread)
    max_tokens = sample_length(rng, config.output_len, config.len_spread)
    return Turn(words.text(rng, input_len), input_len, max_tokens)


def _random(config: WorkloadConfig, rng: np.random.Generator) -> Iterator[tuple[Turn, ...]]:
    while True:
        yield (_turn(rng, config, config.input_len),)


def _prefix(config: WorkloadConfig, rng: np.random.Generator) -> Iterator[tuple[Turn, ...]]:
    prefixes = [words.text(rng, config.prefix_len) for _ in range(config.num_prefixes)]
    while True:
        # One round = every prefix with suffixes_per_prefix fresh suffixes, shuffled so that
        # requests sharing a prefix are spread over the run instead of arriving back to back.
        pairs = [p for p in range(config.num_prefixes) for _ in range(config.suffixes_per_prefix)]
        for index in rng.permutation(len(pairs)):
            suffix = _turn(rng, config, config.suffix_len)
            text = f"{prefixes[pairs[index]]} {suffix.text}"
            yield (Turn(text, config.prefix_len + suffix.input_len, suffix.max_tokens),)


def _multiturn(config: WorkloadConfig, rng: np.random.Generator) -> Iterator[tuple[Turn, ...]]:
    while True:
        yield tuple(_turn(rng, config, config.input_len) for _ in range(config.turns))


def _long_interference(config: WorkloadConfig, rng: np.random.Generator) -> Iterator[tuple[Turn, ...]]:
    while True:
        long = rng.random() < config.long_fraction
        yield (_turn(rng, config, config.long_input_len if long else config.input_len),)


_GENERATORS: dict[str, Callable[[WorkloadConfig, np.random.Generator], Iterator[tuple[Turn, ...]]]] = {
    "random": _random,
    "prefix": _prefix,
    "multiturn": _multiturn,
    "long-interference": _long_interference,
}


def sessions(config: WorkloadConfig, seed: int) -> Iterator[Session]:
    """The workload's sessions, forever; the same config and seed give the same sessions."""
    turns = _GENERATORS[config.name](config, np.random.default_rng(seed))
    for session_id, session_turns in enumerate(turns):
        yield Session(session_id, session_turns)
