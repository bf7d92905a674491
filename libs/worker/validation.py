"""Checks on a prompt before it reaches the engine, with messages that say what is wrong."""

from __future__ import annotations

from collections.abc import Sequence

from libs.worker.errors import InvalidRequest


def validate_prompt(token_ids: Sequence[int], *, vocab_size: int, max_model_len: int) -> None:
    if not token_ids:
        raise InvalidRequest("prompt is empty: at least one token id is required")
    if len(token_ids) >= max_model_len:
        raise InvalidRequest(
            f"prompt has {len(token_ids)} tokens; this model's context is {max_model_len} tokens "
            "and at least one must remain for the output"
        )
    bad = [t for t in token_ids if t < 0 or t >= vocab_size]
    if bad:
        shown = ", ".join(str(t) for t in bad[:5]) + (" ..." if len(bad) > 5 else "")
        raise InvalidRequest(f"{len(bad)} token id(s) outside the vocabulary [0, {vocab_size}): {shown}")


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
