"""vLLM's logprob arrays → the worker's TokenLogprobs, as vLLM's own output processor reads them.

Each row holds the scored token first (the sampled token, or the prompt token), then the
step's top tokens. A batch's rows are as wide as its largest request asks for, so each
request keeps only its own `k` top entries (vLLM's append_logprobs_for_next_position). The
scored token is in `top` too, with its own rank, as vLLM's Logprob dict holds it.
"""

from __future__ import annotations

from typing import Any

from libs.worker.engine import TokenLogprob, TopLogprob


def sample_logprobs(lists: Any, num_logprobs: int) -> tuple[TokenLogprob, ...]:
    """vLLM's LogprobsLists (numpy arrays) of one request's new tokens."""
    return _rows(
        lists.logprob_token_ids.tolist(),
        lists.logprobs.tolist(),
        lists.sampled_token_ranks.tolist(),
        num_logprobs,
    )


def prompt_logprobs(tensors: Any, num_logprobs: int) -> tuple[TokenLogprob, ...]:
    """vLLM's LogprobsTensors of one prefill chunk: one row per prompt position scored."""
    token_ids, logprobs, ranks = tensors[0], tensors[1], tensors[2]
    return _rows(token_ids.tolist(), logprobs.tolist(), ranks.tolist(), num_logprobs)


def _rows(
    token_ids: list[list[int]], logprobs: list[list[float]], ranks: list[int], num_logprobs: int
) -> tuple[TokenLogprob, ...]:
    return tuple(
        _row(ids, values, rank, num_logprobs)
        for ids, values, rank in zip(token_ids, logprobs, ranks, strict=True)
    )


def _row(ids: list[int], values: list[float], scored_rank: int, num_logprobs: int) -> TokenLogprob:
    width = len(values) - 1 if num_logprobs < 0 else min(num_logprobs, len(values) - 1)  # -1: all
    # A dict as vLLM builds it: the scored token first, then ranks 1..k (the same entry when the
    # scored token is among them).
    entries = {ids[0]: TopLogprob(token_id=ids[0], logprob=values[0], rank=int(scored_rank))}
    for position in range(1, width + 1):
        entries[ids[position]] = TopLogprob(token_id=ids[position], logprob=values[position], rank=position)
    scored = entries[ids[0]]
    top = tuple(sorted(entries.values(), key=lambda item: item.rank))
    return TokenLogprob(token_id=scored.token_id, logprob=scored.logprob, rank=scored.rank, top=top)
