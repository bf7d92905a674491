"""vLLM's KV cache events, as vLLM 0.32 defines them (vllm/distributed/kv_events.py), without
importing vLLM (that module imports kv_cache_utils, which imports torch).

The Structs carry vLLM's class names as msgspec tags and vLLM's field names, so a list of
them encoded with msgpack decodes with vLLM's own types, and whoever routes or plans on a
real engine's events reads the mock's unchanged. vLLM fields that a text-only, single-group
engine leaves at their defaults (group_idx, kv_cache_spec_*, locality, ownership, session_id)
are left out; msgspec omits defaults on the wire (omit_defaults), as vLLM's do.
"""

# msgspec's types are not on the lint's mypy path (third-party packages live in Bazel's @pypi),
# so Struct's class keywords (tag, omit_defaults, ...) look like arguments to object's
# __init_subclass__; this file only declares messages.
# mypy: disable-error-code="call-arg"

from __future__ import annotations

from typing import Any

import msgspec

MEDIUM_GPU = "GPU"


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base class of the events (tagged by class name, as vLLM's)."""


class BlockStored(KVCacheEvent):
    """Blocks newly cached for prefix reuse, one hash per block, in prompt order."""

    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    # One entry per block: the untagged extra keys (LoRA name, cache_salt) or None.
    extra_keys: list[tuple[Any, ...] | None] | None = None


class BlockRemoved(KVCacheEvent):
    """Blocks evicted from the prefix cache (their memory reused)."""

    block_hashes: list[bytes]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    """The prefix cache was reset."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared
