"""The mock's "model": output tokens that depend only on (sampling key, the tokens so far).

Why: equality checks between topologies (colocated vs prefill/decode, 1 vs 4 workers) must
still mean something on mock workers, and a request migrated to another worker with
prompt + generated tokens as its new prompt must continue exactly as the uninterrupted run.
So the next token is a function of a rolling hash over every token of the context (prompt
and output alike, so where the prompt ends does not matter) and of a sampling key:
- greedy (temperature 0): key 0, the same for every seed and sequence (as greedy vLLM
  gives n equal sequences);
- random sampling: the key mixes the request's seed with the sequence index; a request
  without a seed gets a random one from the core (unrepeatable, as in vLLM).

EOS comes with probability `eos_probability` per position (0: never, runs to max_tokens or a
stop token), decided by the same hash, so it is deterministic too. Other tokens are uniform
over the vocabulary minus EOS. Within min_tokens, EOS and the stop tokens are never drawn
(vLLM masks them): a banned draw is re-drawn from the next hash value.

Logprobs are fake but deterministic: the sampled token at rank 1, alternatives below it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from libs.mockengine.protocol import Logprobs

MASK64 = (1 << 64) - 1
CONTEXT_SEED = 0x6D6F636B656E6731  # the hash of the empty context ("mockeng1")
_UNIT = float(1 << 53)


def splitmix64(value: int) -> int:
    """A 64-bit mixer (Steele et al.'s SplitMix64 finaliser): nearby inputs, unrelated outputs."""
    z = (value + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def extend_context(context_hash: int, token_ids: Iterable[int]) -> int:
    for token in token_ids:
        context_hash = splitmix64(context_hash ^ token)
    return context_hash


def context_hash(token_ids: Iterable[int]) -> int:
    return extend_context(CONTEXT_SEED, token_ids)


def sampling_key(*, temperature: float, seed: int, index: int) -> int:
    """0 for greedy; otherwise one key per (seed, sequence index)."""
    if temperature == 0:
        return 0
    return splitmix64((seed & MASK64) ^ splitmix64(index + 1))


def _unit(value: int) -> float:
    return (value >> 11) / _UNIT


@dataclass(frozen=True)
class TokenModel:
    vocab_size: int
    eos_token_id: int
    eos_probability: float = 0.0

    def __post_init__(self) -> None:
        if self.vocab_size < 3:
            raise ValueError("the mock's vocabulary needs at least 3 tokens")
        if not 0.0 <= self.eos_probability <= 1.0:
            raise ValueError(f"eos_probability must be in [0, 1], got {self.eos_probability}")

    def next_token(self, context: int, key: int, *, banned: frozenset[int] = frozenset()) -> int:
        """The token after `context` (a context_hash) under sampling key `key`; never one
        of `banned` (EOS and stop tokens within min_tokens)."""
        state = splitmix64(context ^ key)
        if self.eos_token_id not in banned and _unit(state) < self.eos_probability:
            return self.eos_token_id
        while True:
            state = splitmix64(state)
            token = state % self.vocab_size
            if token != self.eos_token_id and token not in banned:
                return token

    def logprobs(self, context: int, key: int, token: int, num_top: int) -> Logprobs:
        """The sampled `token` at rank 1 (logprob in (-1, 0]), then num_top - 1 others."""
        state = splitmix64(context ^ key ^ 0x5A5A5A5A)
        chosen = -_unit(state)
        token_ids, logprobs, ranks = [token], [chosen], [1]
        for rank in range(2, num_top + 1):
            state = splitmix64(state)
            other = state % self.vocab_size
            if other == token:
                other = (other + 1) % self.vocab_size
            token_ids.append(other)
            logprobs.append(chosen - rank - _unit(state))
            ranks.append(rank)
        return Logprobs(token_ids=token_ids, logprobs=logprobs, ranks=ranks)

    def prompt_logprobs(self, prompt: Sequence[int], num_top: int) -> list[Logprobs | None]:
        """vLLM's shape: None for the first prompt token, then each prompt token (with a
        rank of its own) followed by `num_top` alternatives ranked 1..num_top."""
        result: list[Logprobs | None] = [None]
        context = CONTEXT_SEED
        for position in range(1, len(prompt)):
            context = splitmix64(context ^ prompt[position - 1])
            state = splitmix64(context ^ 0xA5A5A5A5)
            token = prompt[position]
            token_ids = [token]
            logprobs = [-1.0 - 4.0 * _unit(state)]
            ranks = [1 + state % 8]
            for rank in range(1, num_top + 1):
                state = splitmix64(state)
                token_ids.append(state % self.vocab_size)
                logprobs.append(-0.5 * rank - _unit(state) / 4)
                ranks.append(rank)
            result.append(Logprobs(token_ids=token_ids, logprobs=logprobs, ranks=ranks))
        return result
