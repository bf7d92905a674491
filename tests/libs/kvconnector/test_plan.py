"""Load and save planning of the kvstore connector (no vLLM, no network)."""

from __future__ import annotations

import pytest

from cleave.kvstore.v1 import kvstore_pb2
from libs.kvconnector.plan import LookupResult, RequestState, load_spec, save_specs, tokens_to_load

CHUNK = 64
BLOCK = 32


def keys(prompt_len: int) -> tuple[kvstore_pb2.ChunkKey, ...]:
    return tuple(
        kvstore_pb2.ChunkKey(
            prefix_hash=f"{i:064x}", chunk_index=i, num_tokens=min(CHUNK, prompt_len - i * CHUNK)
        )
        for i in range(-(-prompt_len // CHUNK))
    )


@pytest.mark.parametrize(
    ("matched", "prompt_len", "computed", "expected"),
    [
        (0, 100, 0, 0),
        (128, 300, 0, 128),  # two whole chunks
        (128, 300, 64, 64),  # the engine's own prefix cache already has the first 64
        (128, 300, 128, 0),
        (256, 256, 0, 224),  # the whole prompt stored: the last token is computed, block-aligned
        (64, 65, 0, 64),
        (64, 64, 0, 32),
    ],
)
def test_tokens_to_load(matched: int, prompt_len: int, computed: int, expected: int) -> None:
    assert tokens_to_load(matched, prompt_len, computed, BLOCK) == expected


def test_load_spec_covers_the_chunks_of_the_token_range() -> None:
    state = RequestState(
        "r", 300, LookupResult(192, keys(300)), block_ids=list(range(10)), pending_load=(64, 192)
    )
    spec = load_spec(state, CHUNK)
    assert [k.chunk_index for k in spec.keys] == [1, 2]
    assert (spec.first_token, spec.start, spec.end, spec.block_ids) == (64, 64, 192, tuple(range(10)))


def test_load_spec_starting_inside_a_chunk() -> None:
    state = RequestState("r", 300, LookupResult(192, keys(300)), block_ids=[7] * 10, pending_load=(32, 160))
    spec = load_spec(state, CHUNK)
    assert [k.chunk_index for k in spec.keys] == [0, 1, 2]
    assert spec.first_token == 0 and spec.start == 32


def test_save_specs_send_each_full_computed_chunk_once() -> None:
    state = RequestState(
        "r", 200, LookupResult(64, keys(200)), chunks_done=1, block_ids=[3, 4, 5, 6, 9, 8, 7]
    )
    # Chunked prefill: the first step computes up to token 150, the next to the end.
    first = save_specs(state, CHUNK, computed_end=150)
    assert [(s.key.chunk_index, s.start) for s in first] == [(1, 64)]  # chunk 0 is stored already
    second = save_specs(state, CHUNK, computed_end=201)
    assert [(s.key.chunk_index, s.start) for s in second] == [(2, 128)]  # chunk 3 (8 tokens) is partial
    assert save_specs(state, CHUNK, computed_end=400) == []


def test_nothing_is_saved_without_a_lookup() -> None:
    state = RequestState("r", 200, None)
    assert save_specs(state, CHUNK, computed_end=200) == []
