"""The mock's block hashes and KV events equal vLLM's own, byte for byte (this target loads
vLLM, which imports torch: slow to start, so it is a target of its own)."""

from __future__ import annotations

import os
from typing import Any, ClassVar

import msgspec
import pytest

from libs.kvevents.hashing import BlockHasher, LoraIdentity
from libs.mockengine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

PROMPTS = [
    list(range(1, 40)),
    [7] * 64,
    [49151, 0, 2, 17, 300, 12345, 42, 42, 42, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
]


@pytest.fixture(scope="module")
def vllm_hashing():  # type: ignore[no-untyped-def]
    os.environ.pop("PYTHONHASHSEED", None)  # vLLM would seed NONE_HASH from it
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils

    return kv_cache_utils, get_hash_fn_by_name


def _vllm_hashes(kv_cache_utils, hash_fn, prompt, block_size, salt, lora):  # type: ignore[no-untyped-def]
    """vLLM's request block hasher on a stand-in of its Request (the fields it reads)."""

    class LoraRequest:
        lora_name = lora.name if lora else ""
        lora_path = lora.path if lora else ""

    class Request:
        block_hashes: ClassVar[list[bytes]] = []
        num_tokens = len(prompt)
        all_token_ids = prompt
        mm_features: ClassVar[list[object]] = []
        lora_request = LoraRequest() if lora else None
        cache_salt = salt or None
        prompt_embeds = None

    kv_cache_utils.init_none_hash(hash_fn)
    return kv_cache_utils.get_request_block_hasher(block_size, hash_fn)(Request())


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
@pytest.mark.parametrize("salt", ["", "tenant-a"])
@pytest.mark.parametrize("block_size", [16, 4])
def test_block_hashes_equal_vllms(vllm_hashing, algo: str, salt: str, block_size: int) -> None:  # type: ignore[no-untyped-def]
    kv_cache_utils, get_hash_fn_by_name = vllm_hashing
    hash_fn = get_hash_fn_by_name(algo)
    mock = BlockHasher(block_size, algo)
    for prompt in PROMPTS:
        expected = _vllm_hashes(kv_cache_utils, hash_fn, prompt, block_size, salt, None)
        assert expected, "the prompt has full blocks"
        assert mock.hashes(prompt, cache_salt=salt) == expected


def test_lora_block_hashes_equal_vllms(vllm_hashing) -> None:  # type: ignore[no-untyped-def]
    kv_cache_utils, get_hash_fn_by_name = vllm_hashing
    hash_fn = get_hash_fn_by_name("sha256")
    lora = LoraIdentity("sql", "/adapters/sql", 1)
    for prompt in PROMPTS:
        expected = _vllm_hashes(kv_cache_utils, hash_fn, prompt, 16, "s", lora)
        assert BlockHasher(16).hashes(prompt, cache_salt="s", lora=lora) == expected


def test_kv_events_decode_as_vllms_own_types() -> None:
    from vllm.distributed import kv_events as vllm_events

    mock = [
        BlockStored(
            block_hashes=[b"\x01" * 32, b"\x02" * 32],
            parent_block_hash=None,
            token_ids=list(range(32)),
            block_size=16,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            extra_keys=[("salt",), None],
        ),
        BlockRemoved(block_hashes=[b"\x01" * 32], medium="GPU"),
        AllBlocksCleared(),
    ]
    wire = msgspec.msgpack.encode(mock)
    event_types: Any = list[vllm_events.BlockStored | vllm_events.BlockRemoved | vllm_events.AllBlocksCleared]
    decoded = msgspec.msgpack.decode(wire, type=event_types)
    assert [type(e).__name__ for e in decoded] == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]
    stored = decoded[0]
    assert stored.block_hashes == [b"\x01" * 32, b"\x02" * 32]
    assert stored.token_ids == list(range(32)) and stored.block_size == 16 and stored.medium == "GPU"
    assert [None if k is None else tuple(k) for k in stored.extra_keys] == [("salt",), None]
    assert decoded[1].block_hashes == [b"\x01" * 32]
