"""Checks on a request before it reaches the engine, with messages that say what is wrong.

Whatever can be checked here is: an engine that rejects a request fails it as a client
mistake too (libs/worker/vllm_engine.py), but only after it has been queued, and its
messages name vLLM's fields rather than the API's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from cleave.common.v1 import common_pb2
from libs.worker.engine import Adapter
from libs.worker.errors import InvalidRequest


def _out_of_vocabulary(token_ids: Iterable[int], vocab_size: int) -> list[int]:
    return [t for t in token_ids if t < 0 or t >= vocab_size]


def _shown(ids: Sequence[int]) -> str:
    return ", ".join(str(t) for t in ids[:5]) + (" ..." if len(ids) > 5 else "")


def validate_prompt(token_ids: Sequence[int], *, vocab_size: int, max_model_len: int) -> None:
    if not token_ids:
        raise InvalidRequest("prompt is empty: at least one token id is required")
    if len(token_ids) >= max_model_len:
        raise InvalidRequest(
            f"prompt has {len(token_ids)} tokens; this model's context is {max_model_len} tokens "
            "and at least one must remain for the output"
        )
    bad = _out_of_vocabulary(token_ids, vocab_size)
    if bad:
        raise InvalidRequest(
            f"{len(bad)} token id(s) outside the vocabulary [0, {vocab_size}): {_shown(bad)}"
        )


def validate_token_fields(sampling: common_pb2.SamplingParams, *, vocab_size: int) -> None:
    """Token ids inside the sampling parameters index the logits: one past the vocabulary
    is a request vLLM refuses (or, in older versions, an index error in the engine)."""
    for name, ids in (
        ("logit_bias", sorted(sampling.logit_bias)),
        ("stop_token_ids", sampling.stop_token_ids),
    ):
        bad = _out_of_vocabulary(ids, vocab_size)
        if bad:
            raise InvalidRequest(
                f"{name} has {len(bad)} token id(s) outside the vocabulary [0, {vocab_size}): {_shown(bad)}"
            )


def resolve_max_tokens(requested: int | None, *, prompt_len: int, max_model_len: int) -> int:
    """OpenAI semantics: unset means "until the context is full"."""
    room = max_model_len - prompt_len
    if requested is None:
        return room
    if requested <= 0:
        raise InvalidRequest(f"max_tokens must be at least 1, got {requested}")
    if requested > room:
        raise InvalidRequest(
            f"max_tokens={requested} plus the prompt's {prompt_len} tokens exceeds the model's "
            f"context of {max_model_len} tokens (at most {room} new tokens fit)"
        )
    return requested


def sequence_prefixes(
    sequences: Iterable[Any], *, n: int, max_tokens: int, moved_alone: bool
) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """GenerateRequest.sequences (a moved request's open sequences), checked: distinct
    indexes below n, each with tokens left in its budget. `moved_alone`: the request carries
    no handoff or images (a continuation computes its prompts itself, from text)."""
    prefixes = tuple((int(s.index), tuple(s.token_ids)) for s in sequences)
    if not prefixes:
        return ()
    if not moved_alone:
        raise InvalidRequest("sequences (a moved request) cannot come with a KV handoff or images")
    indexes = [index for index, _ in prefixes]
    if len(set(indexes)) != len(indexes) or not all(0 <= index < n for index in indexes):
        raise InvalidRequest(f"sequences must have distinct indexes in [0, n={n}); got {indexes}")
    for index, tokens in prefixes:
        if len(tokens) >= max_tokens:
            raise InvalidRequest(
                f"sequence {index} already has {len(tokens)} tokens of max_tokens={max_tokens}: none is left"
            )
    return prefixes


def adapter_of(metadata: common_pb2.RequestMetadata) -> Adapter | None:
    """The LoRA adapter a request names (None: the base model); both its fields are required."""
    if not metadata.HasField("lora"):
        return None
    if not metadata.lora.name or not metadata.lora.path:
        raise InvalidRequest("a LoRA adapter needs both a name and a path")
    return Adapter(metadata.lora.name, metadata.lora.path)
