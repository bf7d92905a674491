"""Block hashes are computed as vLLM 0.32 computes them (the byte-for-byte comparison with
vLLM itself is test_hashing_vllm.py, a target that loads vLLM)."""

from __future__ import annotations

import hashlib
import pickle

import cbor2
import pytest

from libs.kvevents.hashing import BlockHasher, LoraIdentity, event_extra_keys, hash_function


def test_the_first_blocks_parent_is_the_hash_of_vllms_fixed_seed() -> None:
    hasher = BlockHasher(4)
    none_hash = hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=pickle.HIGHEST_PROTOCOL)).digest()
    assert hasher.none_hash == none_hash
    expected = hashlib.sha256(
        pickle.dumps((none_hash, (1, 2, 3, 4), None), protocol=pickle.HIGHEST_PROTOCOL)
    ).digest()
    assert hasher.hashes([1, 2, 3, 4]) == [expected]


def test_hashes_chain_and_only_full_blocks_are_hashed() -> None:
    hasher = BlockHasher(4)
    hashes = hasher.hashes(list(range(10)))
    assert len(hashes) == 2
    assert hashes[1] == hasher.hash_block(hashes[0], [4, 5, 6, 7], None)
    assert hasher.hashes([0, 1, 2, 3, 4, 5, 6, 7])[1] == hashes[1]
    assert hasher.hashes([9, 1, 2, 3, 4, 5, 6, 7])[1] != hashes[1]  # a block's hash covers its prefix


def test_extend_hashes_only_the_new_full_blocks() -> None:
    hasher = BlockHasher(4)
    hashes: list[bytes] = []
    assert hasher.extend(hashes, [1, 2, 3]) == []
    assert len(hasher.extend(hashes, [1, 2, 3, 4, 5])) == 1
    assert len(hasher.extend(hashes, [1, 2, 3, 4, 5, 6, 7, 8, 9])) == 1
    assert hashes == hasher.hashes([1, 2, 3, 4, 5, 6, 7, 8])


def test_cache_salt_is_an_extra_key_of_the_first_block_only() -> None:
    hasher = BlockHasher(4)
    assert hasher.extra_keys(0, "salt", None) == (("cache_salt", "salt"),)
    assert hasher.extra_keys(4, "salt", None) is None
    salted, plain = hasher.hashes(list(range(8)), cache_salt="salt"), hasher.hashes(list(range(8)))
    assert salted[0] != plain[0] and salted[1] != plain[1]  # the second differs through its parent
    assert salted[1] == hasher.hash_block(salted[0], [4, 5, 6, 7], None)


def test_lora_name_and_path_are_extra_keys_of_every_block_before_the_salt() -> None:
    hasher = BlockHasher(4)
    lora = LoraIdentity("sql", "/adapters/sql", 7)
    assert hasher.extra_keys(0, "s", lora) == (("lora", "sql", "/adapters/sql"), ("cache_salt", "s"))
    assert hasher.extra_keys(4, "s", lora) == (("lora", "sql", "/adapters/sql"),)
    assert event_extra_keys(hasher.extra_keys(0, "s", lora)) == ("sql", "s")
    assert event_extra_keys(None) is None


def test_sha256_cbor_is_canonical_cbor_then_sha256() -> None:
    hasher = BlockHasher(2, algo="sha256_cbor")
    seed_hash = hashlib.sha256(cbor2.dumps("vllm-none-hash", canonical=True)).digest()
    expected = hashlib.sha256(cbor2.dumps((seed_hash, (5, 6), None), canonical=True)).digest()
    assert hasher.hashes([5, 6]) == [expected]


def test_unknown_algorithms_are_refused() -> None:
    with pytest.raises(ValueError, match="xxhash"):
        hash_function("xxhash")
