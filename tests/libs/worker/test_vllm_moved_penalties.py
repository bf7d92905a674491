"""The penalties hook for moved requests: a request whose last prompt tokens were generated
before a move gets vLLM's penalties as the uninterrupted run would (those tokens as output), the
built-in penalties neutral so nothing counts twice; other rows are left as they were, and rows
follow vLLM's batch bookkeeping (removals, moves, swaps)."""

from __future__ import annotations

import pytest
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality
from vllm.v1.sample.ops.penalties import apply_all_penalties

from libs.worker.sampling import RESERVED_EXTRA_ARGS_PREFIX
from libs.worker.vllm_moved_penalties import (
    MOVED_PENALTIES,
    NEUTRAL,
    MovedPenaltiesProcessor,
    moved_penalties,
)

VOCAB = 32
PROMPT = [3, 4, 5, 3]
MOVED = [7, 7, 9]  # generated before the move
PENALTIES = {"presence_penalty": 0.6, "frequency_penalty": 0.4, "repetition_penalty": 1.3}


def penalized(prompt: list[int], output: list[int], **penalties: float) -> torch.Tensor:
    """vLLM's own penalties on one row of fixed logits: the uninterrupted run's."""
    logits = logits_rows(1)
    prompt_t = torch.tensor([prompt], dtype=torch.int64)
    column = {name: torch.tensor([penalties.get(name, neutral)]) for name, neutral in NEUTRAL.items()}
    apply_all_penalties(
        logits, prompt_t, column["presence_penalty"], column["frequency_penalty"],
        column["repetition_penalty"], [output],
    )  # fmt: skip
    return logits[0]


def logits_rows(rows: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    return torch.randn(1, VOCAB, generator=generator).repeat(rows, 1)


def moved_params() -> SamplingParams:
    params = SamplingParams(temperature=0, **PENALTIES)
    assert moved_penalties(params, len(MOVED))
    return params


def processor() -> MovedPenaltiesProcessor:
    return MovedPenaltiesProcessor(None, torch.device("cpu"), False)


def test_the_params_hand_their_penalties_over_and_turn_neutral() -> None:
    assert MOVED_PENALTIES.startswith(RESERVED_EXTRA_ARGS_PREFIX)  # no client can send it
    params = moved_params()
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.0, 0.0, 1.0)
    assert params.extra_args == {MOVED_PENALTIES: {"moved": 3, **PENALTIES}}


@pytest.mark.parametrize(
    ("moved", "penalties"),
    [(0, PENALTIES), (3, {"repetition_penalty": 1.3}), (3, {})],
)
def test_nothing_moved_or_no_output_penalty_leaves_vllm_in_charge(
    moved: int, penalties: dict[str, float]
) -> None:
    params = SamplingParams(**penalties)
    assert not moved_penalties(params, moved)
    assert params.extra_args is None and params.repetition_penalty == penalties.get("repetition_penalty", 1.0)


def test_a_moved_row_is_penalized_as_the_uninterrupted_run_and_others_are_left_alone() -> None:
    output: list[int] = [9]  # generated here, after the move
    hook = processor()
    hook.update_state(
        BatchUpdate(
            batch_size=2,
            removed=[],
            added=[(0, SamplingParams(), [1, 2], []), (1, moved_params(), PROMPT + MOVED, output)],
            moved=[],
        )
    )
    logits = hook.apply(logits_rows(2))
    assert torch.equal(logits[0], logits_rows(1)[0])
    uninterrupted = penalized(PROMPT, MOVED + output, **PENALTIES)
    assert torch.equal(logits[1], uninterrupted)
    # What vLLM alone would do with the moved tokens as prompt is not that.
    assert not torch.allclose(penalized(PROMPT + MOVED, output, **PENALTIES), uninterrupted)

    output.append(11)  # vLLM appends to the list it handed over; the next step counts it
    assert torch.equal(hook.apply(logits_rows(2))[1], penalized(PROMPT, [*MOVED, 9, 11], **PENALTIES))


def test_rows_follow_vllms_swaps_moves_and_removals() -> None:
    hook = processor()
    hook.update_state(
        BatchUpdate(batch_size=2, removed=[], added=[(1, moved_params(), PROMPT + MOVED, [])], moved=[])
    )
    hook.update_state(
        BatchUpdate(batch_size=2, removed=[], added=[], moved=[(0, 1, MoveDirectionality.SWAP)])
    )
    logits = hook.apply(logits_rows(2))
    assert torch.equal(logits[0], penalized(PROMPT, MOVED, **PENALTIES))
    assert torch.equal(logits[1], logits_rows(1)[0])
    hook.update_state(BatchUpdate(batch_size=1, removed=[0], added=[], moved=[]))
    assert torch.equal(hook.apply(logits_rows(1)), logits_rows(1))
