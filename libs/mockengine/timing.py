"""How long a simulated engine step takes, from what it schedules.

The formula (the same text is in every profile's "formula" field; a profile cannot change
it, only its coefficients):

    t = base_s
      + per_seq_s               * num_seqs
      + per_prefill_token_s     * prefill_tokens
      + per_context_token_s     * context_tokens_attended
      + per_prefill_attention_s * sum over prefill chunks of chunk_len * (chunk_start + chunk_len / 2)

    t_simulated = t * time_scale

where, for the sequences scheduled in the step:
- num_seqs: every scheduled sequence, decode or prefill;
- prefill_tokens: tokens of sequences computing prompt tokens (a chunk of a prompt, a
  preempted sequence recomputing, the last prompt token after a KV pull);
- context_tokens_attended: for each decode sequence (one output token), the tokens already
  in its KV cache, which its attention reads;
- chunk_start / chunk_len: where a prefill chunk starts in its sequence and how long it is;
  chunk_len * (chunk_start + chunk_len / 2) is the number of (query, key) pairs its causal
  attention computes, to first order.

Why this shape: a step runs every layer's weights once (base_s, memory-bound), per-sequence
work (sampling, bookkeeping: per_seq_s), the matmuls over every new token (per_prefill_token_s;
a decode token's share is in per_seq_s), decode attention that streams the context's KV
(per_context_token_s) and prefill attention, quadratic in the prompt. Prefill and decode
share a step, so a prefill chunk delays every decode sequence in the same step by its
per_prefill_token_s and attention terms: what disaggregation removes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

FORMULA = (
    "t = (base_s + per_seq_s * num_seqs + per_prefill_token_s * prefill_tokens"
    " + per_context_token_s * context_tokens_attended"
    " + per_prefill_attention_s * sum(chunk_len * (chunk_start + chunk_len / 2))) * time_scale;"
    " num_seqs: scheduled sequences; prefill_tokens: tokens of chunks that compute prompt tokens;"
    " context_tokens_attended: KV tokens read by decode sequences; chunk_*: each prefill chunk"
)


@dataclass(frozen=True)
class StepCoefficients:
    base_s: float = 0.0
    per_seq_s: float = 0.0
    per_prefill_token_s: float = 0.0
    per_context_token_s: float = 0.0
    per_prefill_attention_s: float = 0.0

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value < 0:
                raise ValueError(f"step-time coefficient {name} must be >= 0, got {value}")

    @property
    def is_zero(self) -> bool:
        return not any(vars(self).values())


@dataclass(frozen=True)
class BatchShape:
    """What the formula reads from one step's schedule."""

    num_seqs: int = 0
    prefill_tokens: int = 0
    context_tokens_attended: int = 0
    prefill_attention_pairs: float = 0.0

    @classmethod
    def of(cls, chunks: Iterable[tuple[int, int, bool]]) -> BatchShape:
        """From (chunk_start, chunk_len, is_decode) per scheduled sequence."""
        num_seqs = prefill_tokens = context = 0
        pairs = 0.0
        for start, length, is_decode in chunks:
            num_seqs += 1
            if is_decode:
                context += start
            else:
                prefill_tokens += length
                pairs += length * (start + length / 2)
        return cls(num_seqs, prefill_tokens, context, pairs)


@dataclass(frozen=True)
class StepTimeModel:
    coefficients: StepCoefficients
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.time_scale < 0:
            raise ValueError(f"time scale must be >= 0, got {self.time_scale}")

    @property
    def is_zero(self) -> bool:
        return self.coefficients.is_zero or self.time_scale == 0

    def unscaled_seconds(self, shape: BatchShape) -> float:
        c = self.coefficients
        if shape.num_seqs == 0:
            return 0.0
        return (
            c.base_s
            + c.per_seq_s * shape.num_seqs
            + c.per_prefill_token_s * shape.prefill_tokens
            + c.per_context_token_s * shape.context_tokens_attended
            + c.per_prefill_attention_s * shape.prefill_attention_pairs
        )

    def seconds(self, shape: BatchShape) -> float:
        """The simulated (scaled) duration of a step of this shape."""
        return self.unscaled_seconds(shape) * self.time_scale

    def scaled(self, seconds: float) -> float:
        """Any other simulated duration (a KV transfer, start-up) on the same clock."""
        return seconds * self.time_scale
