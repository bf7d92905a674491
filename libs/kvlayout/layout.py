"""The one function that turns an engine's KV facts into the contract's KvLayout.

Every KvLayout in Cleave comes from kv_layout(): the one a worker stamps on its handoffs and
reports in GetInfo (which the gateway's kvstore lookups use), and the one the kvstore
connector keys chunks by. Two computations could drift apart, and then every kvstore lookup
would miss without an error.
"""

from __future__ import annotations

from dataclasses import dataclass

from cleave.common.v1 import common_pb2

# vLLM's KV cache dtype names (with "auto" already resolved to the model's dtype), plus
# "mxint8", the cache dtype of the Cloud AI (QAIC) plugin.
KV_DTYPES = {
    "bfloat16": common_pb2.DTYPE_BFLOAT16,
    "float16": common_pb2.DTYPE_FLOAT16,
    "float32": common_pb2.DTYPE_FLOAT32,
    "fp8": common_pb2.DTYPE_FP8_E4M3,
    "fp8_e4m3": common_pb2.DTYPE_FP8_E4M3,
    "fp8_e5m2": common_pb2.DTYPE_FP8_E5M2,
    "mxint8": common_pb2.DTYPE_MXINT8,
}


@dataclass(frozen=True)
class KvFacts:
    """What an engine's KV cache is, in engine terms (from_vllm.py reads them from vLLM)."""

    model_fingerprint: str
    block_size: int
    # What the cache holds: a name in KV_DTYPES, never "auto".
    kv_cache_dtype: str
    num_layers: int
    num_kv_heads: int
    head_dim: int


def kv_layout(facts: KvFacts) -> common_pb2.KvLayout:
    """A dtype outside KV_DTYPES becomes DTYPE_UNSPECIFIED: such KV can still be handed to an
    identical engine (the layouts compare equal), but the kvstore refuses to key it."""
    return common_pb2.KvLayout(
        model_fingerprint=facts.model_fingerprint,
        block_size=facts.block_size,
        kv_dtype=KV_DTYPES.get(facts.kv_cache_dtype, common_pb2.DTYPE_UNSPECIFIED),
        num_layers=facts.num_layers,
        num_kv_heads=facts.num_kv_heads,
        head_dim=facts.head_dim,
    )
