"""What to load from and save to the kvstore, per request and step (pure; no vLLM, no I/O).

The vLLM connector's scheduler half feeds these functions the kvstore's Lookup answer and
the scheduler's view of a request; the results travel to the worker half as metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cleave.kvstore.v1 import kvstore_pb2


@dataclass(frozen=True)
class LookupResult:
    matched_tokens: int
    # Keys of every chunk of the prompt, stored or not, in order (the last may be partial).
    keys: tuple[kvstore_pb2.ChunkKey, ...]


@dataclass(frozen=True)
class LoadSpec:
    """Fetch `keys` (consecutive chunks, the first starting at token `first_token`) and write
    their tokens [start, end) into the request's blocks."""

    request_id: str
    keys: tuple[kvstore_pb2.ChunkKey, ...]
    first_token: int
    start: int
    end: int
    block_ids: tuple[int, ...]


@dataclass(frozen=True)
class SaveSpec:
    """Copy tokens [start, start + key.num_tokens) out of the request's blocks under `key`."""

    request_id: str
    key: kvstore_pb2.ChunkKey
    start: int
    block_ids: tuple[int, ...]


@dataclass
class RequestState:
    request_id: str
    prompt_len: int
    lookup: LookupResult | None
    # Leading chunks the kvstore holds or this worker has sent; nothing below is saved again.
    chunks_done: int = 0
    block_ids: list[int] = field(default_factory=list)
    pending_load: tuple[int, int] | None = None  # tokens [start, end) to load next step


def tokens_to_load(matched_tokens: int, prompt_len: int, num_computed: int, block_size: int) -> int:
    """Tokens the kvstore can supply beyond what the engine already has.

    vLLM must compute at least the prompt's last token itself (it needs that token's logits),
    and external hits must end on a block boundary, as the scheduler allocates whole blocks.
    """
    usable = min(matched_tokens, prompt_len - 1) // block_size * block_size
    return max(0, usable - num_computed)


def load_spec(state: RequestState, chunk_tokens: int) -> LoadSpec:
    assert state.lookup is not None and state.pending_load is not None
    start, end = state.pending_load
    first, last = start // chunk_tokens, (end - 1) // chunk_tokens
    return LoadSpec(
        request_id=state.request_id,
        keys=state.lookup.keys[first : last + 1],
        first_token=first * chunk_tokens,
        start=start,
        end=end,
        block_ids=tuple(state.block_ids),
    )


def save_specs(state: RequestState, chunk_tokens: int, computed_end: int) -> list[SaveSpec]:
    """Full chunks of the prompt whose tokens are all computed by the end of this step and
    are not stored yet. A partial last chunk is not saved: its key would differ from the
    full chunk a longer prompt needs, so it is rarely reused (LMCache's default, too)."""
    if state.lookup is None:
        return []
    specs = []
    limit = min(computed_end, state.prompt_len)
    keys: Sequence[kvstore_pb2.ChunkKey] = state.lookup.keys
    index = state.chunks_done
    while (
        index < len(keys) and keys[index].num_tokens == chunk_tokens and (index + 1) * chunk_tokens <= limit
    ):
        specs.append(
            SaveSpec(
                request_id=state.request_id,
                key=keys[index],
                start=index * chunk_tokens,
                block_ids=tuple(state.block_ids),
            )
        )
        index += 1
    state.chunks_done = index
    return specs


def stored_leading_chunks(matched_tokens: int, chunk_tokens: int) -> int:
    return matched_tokens // chunk_tokens
