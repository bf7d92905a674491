"""Prefix-cache block hashes computed exactly as vLLM 0.32 computes them, without vLLM.

Who needs them: the mock engine, whose KV events must name the blocks a real engine would,
and the gateways, which hash each prompt to look it up in the blocks the workers' KV events
say they cache (libs/gateway/fleet/routing/kv_events.py). Why a copy: importing
`vllm.v1.core.kv_cache_utils` pulls torch (about 18 s and 670 MB), and neither a gateway nor
a fleet of mock workers may pay that. Why exact: a prompt must hash to the same bytes on a
mock, on vLLM and in a gateway (tests/libs/mockengine/test_hashing_vllm.py checks it against
the installed vLLM).

What vLLM does (vllm/v1/core/kv_cache_utils.py and vllm/utils/hashing.py):
- NONE_HASH, the parent of a prompt's first block, is hash_fn(seed) where the seed is
  PYTHONHASHSEED when set, else the fixed "vllm-none-hash" for the sha256 algorithms.
- A full block's hash is hash_fn((parent_hash, tuple(block_token_ids), extra_keys)).
  Only full blocks are hashed.
- extra_keys is None, or a tuple of tagged keys in this order: ("lora", name, path) on every
  block of a LoRA request, (multimodal keys, not simulated), ("cache_salt", salt) on the
  first block only (token index 0).
- KV events publish each hash as its low 64 bits, an integer (vLLM's maybe_convert_block_hash
  under VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, on by default): `block_key`.
- `--prefix-caching-hash-algo`: "sha256" (the default: pickle, highest protocol, then
  SHA-256) or "sha256_cbor" (canonical CBOR, then SHA-256). The xxhash variants use a random
  per-process seed and are not simulated.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import cbor2

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
DEFAULT_HASH_ALGO = "sha256"

HashFn = Callable[[Any], bytes]
# The algorithms whose seed is reproducible: vLLM seeds xxhash with random bytes per process
# unless PYTHONHASHSEED is set, so nobody outside the engine can compute its hashes.
SEEDED_BY_DEFAULT = frozenset({"sha256", "sha256_cbor"})


def none_hash_seed(algo: str, environment: Mapping[str, str]) -> str | None:
    """The seed vLLM derives the first block's parent from (resolve_none_hash_seed), in an engine
    started with `environment`; None when it is random (xxhash without PYTHONHASHSEED)."""
    seed = environment.get("PYTHONHASHSEED")
    if seed is not None:
        return seed
    return DEFAULT_NONE_HASH_SEED if algo in SEEDED_BY_DEFAULT else None


def block_key(block_hash: bytes | int) -> int:
    """A block hash as KV events carry it: vLLM's integer form (the hash's low 64 bits), so
    byte hashes (the mock's events, a gateway's own hashing) and integers compare equal."""
    if isinstance(block_hash, int):
        return block_hash & _LOW_64_BITS
    return int.from_bytes(block_hash, byteorder="big") & _LOW_64_BITS


_LOW_64_BITS = (1 << 64) - 1


def sha256_pickle(value: Any) -> bytes:
    """vLLM's "sha256": pickle (highest protocol), then SHA-256."""
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sha256_cbor(value: Any) -> bytes:
    """vLLM's "sha256_cbor": canonical CBOR, then SHA-256 (language independent)."""
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


HASH_FUNCTIONS: dict[str, HashFn] = {"sha256": sha256_pickle, "sha256_cbor": sha256_cbor}


def hash_function(algo: str) -> HashFn:
    try:
        return HASH_FUNCTIONS[algo]
    except KeyError:
        raise ValueError(
            f"unsupported prefix-caching hash algorithm {algo!r}; the mock knows {sorted(HASH_FUNCTIONS)}"
        ) from None


@dataclass(frozen=True)
class LoraIdentity:
    """What of a LoRA adapter vLLM folds into block hashes (name and path) and publishes
    in KV events (name and its integer id)."""

    name: str
    path: str
    int_id: int


@dataclass(frozen=True)
class BlockHasher:
    """Hashes a request's full blocks as vLLM's `get_request_block_hasher` does."""

    block_size: int
    algo: str = DEFAULT_HASH_ALGO
    none_hash_seed: str = DEFAULT_NONE_HASH_SEED

    @cached_property
    def none_hash(self) -> bytes:
        return hash_function(self.algo)(self.none_hash_seed)

    def extra_keys(
        self, block_start: int, cache_salt: str, lora: LoraIdentity | None
    ) -> tuple[Any, ...] | None:
        """vLLM's generate_block_hash_extra_keys for text-only requests."""
        keys: list[Any] = []
        if lora is not None:
            keys.append(("lora", lora.name, lora.path))
        if block_start == 0 and cache_salt:
            keys.append(("cache_salt", cache_salt))
        return tuple(keys) if keys else None

    def hash_block(
        self, parent: bytes | None, block_tokens: Sequence[int], extra_keys: tuple[Any, ...] | None
    ) -> bytes:
        """vLLM's hash_block_tokens."""
        parent_hash = parent if parent else self.none_hash
        return hash_function(self.algo)((parent_hash, tuple(block_tokens), extra_keys))

    def extend(
        self,
        hashes: list[bytes],
        token_ids: Sequence[int],
        *,
        cache_salt: str = "",
        lora: LoraIdentity | None = None,
    ) -> list[bytes]:
        """Appends to `hashes` (a request's hashes so far) the hashes of the full blocks of
        `token_ids` (the request's tokens so far) not hashed yet; returns the new ones."""
        new: list[bytes] = []
        start = len(hashes) * self.block_size
        while start + self.block_size <= len(token_ids):
            parent = hashes[-1] if hashes else None
            block = token_ids[start : start + self.block_size]
            block_hash = self.hash_block(parent, block, self.extra_keys(start, cache_salt, lora))
            hashes.append(block_hash)
            new.append(block_hash)
            start += self.block_size
        return new

    def hashes(
        self, token_ids: Sequence[int], *, cache_salt: str = "", lora: LoraIdentity | None = None
    ) -> list[bytes]:
        """Every full block's hash of `token_ids`, first block first."""
        result: list[bytes] = []
        self.extend(result, token_ids, cache_salt=cache_salt, lora=lora)
        return result

    def keys(
        self, token_ids: Sequence[int], *, cache_salt: str = "", lora: LoraIdentity | None = None
    ) -> list[int]:
        """Every full block's `block_key`, first block first: what KV events name them by."""
        return [block_key(h) for h in self.hashes(token_ids, cache_salt=cache_salt, lora=lora)]


def event_extra_keys(extra_keys: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
    """vLLM's to_event_extra_keys for one block: KV events publish the keys untagged (the
    LoRA name alone, the salt alone)."""
    if extra_keys is None:
        return None
    return tuple(key[1] for key in extra_keys)
