"""A moved request's penalties, counted as the uninterrupted run counts them.

vLLM's gap: presence and frequency penalties count a request's output tokens, and a request
that moved to this worker after its first worker failed (libs/gateway/serving/migration.py)
carries the tokens it generated before the move at the end of its prompt, where they would no
longer be penalized. vLLM has no way to add a request with output tokens it did not generate.

The smallest hook that fills it is vLLM's own extension point for sampling, a logits
processor: the worker sends such a request with neutral penalties and the real ones, with
how many of its prompt tokens were generated, in `extra_args[MOVED_PENALTIES]`
(`moved_penalties`); this processor applies vLLM's penalty function to it with those tokens
counted as output. vLLM runs custom logits processors after its own (min_tokens, logit_bias)
and right before its penalties and temperature, so with the built-in penalties neutral the
logits are those of the uninterrupted run, repetition_penalty included. vLLM refuses custom
logits processors when it speculates (STR_SPEC_DEC_REJECTS_LOGITSPROCS), so a speculating
worker keeps the moved tokens as prompt for the penalties (vllm_engine.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from vllm import SamplingParams
from vllm.utils.torch_utils import make_tensor_with_pad
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates
from vllm.v1.sample.ops.penalties import apply_all_penalties

MOVED_PENALTIES = "cleave_moved_penalties"
NEUTRAL = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}


def moved_penalties(params: SamplingParams, moved_tokens: int) -> bool:
    """Hands `params`' penalties to MovedPenaltiesProcessor when the last `moved_tokens` prompt
    tokens were generated before a move and a penalty counts them as output; True if it did."""
    if moved_tokens <= 0 or (params.presence_penalty == 0 and params.frequency_penalty == 0):
        return False  # repetition_penalty alone counts prompt and output alike
    penalties = {name: float(getattr(params, name)) for name in NEUTRAL}
    params.extra_args = {**(params.extra_args or {}), MOVED_PENALTIES: {"moved": moved_tokens, **penalties}}
    for name, value in NEUTRAL.items():
        setattr(params, name, value)
    return True


@dataclass(frozen=True)
class _Row:
    prompt: list[int]  # the prompt before the move
    moved: list[int]  # generated before the move
    output: list[int]  # vLLM's list of this worker's output tokens, which it keeps current
    presence: float
    frequency: float
    repetition: float


def _row(params: SamplingParams, prompt: list[int] | None, output: list[int]) -> _Row | None:
    handed = (params.extra_args or {}).get(MOVED_PENALTIES)
    if not handed or prompt is None:
        return None
    cut = len(prompt) - int(handed["moved"])
    return _Row(
        prompt=prompt[:cut],
        moved=prompt[cut:],
        output=output,
        presence=float(handed["presence_penalty"]),
        frequency=float(handed["frequency_penalty"]),
        repetition=float(handed["repetition_penalty"]),
    )


class MovedPenaltiesProcessor(LogitsProcessor):
    """vLLM's penalties for the moved requests in the batch, the moved tokens counted as output."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self._device = device
        self._rows: dict[int, _Row] = {}  # by batch index

    def is_argmax_invariant(self) -> bool:
        return False  # penalties change which token is likeliest

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self._rows, batch_update, _row)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self._rows:
            return logits
        indexes = sorted(self._rows)
        rows = [self._rows[index] for index in indexes]
        vocab_size = logits.shape[1]
        selected = logits[indexes]  # a copy: penalized below, then written back

        def column(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=logits.dtype, device=self._device)

        prompts = make_tensor_with_pad(
            [row.prompt for row in rows], pad=vocab_size, device=self._device, dtype=torch.int64
        )
        apply_all_penalties(
            selected,
            prompts,
            column([row.presence for row in rows]),
            column([row.frequency for row in rows]),
            column([row.repetition for row in rows]),
            [[*row.moved, *row.output] for row in rows],
        )
        logits[indexes] = selected
        return logits


PROCESSOR = f"{__name__}:{MovedPenaltiesProcessor.__name__}"  # vLLM loads it by this name
