"""KV layout identity: KV computed under one layout is garbage under another (field note 6)."""

from __future__ import annotations

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2
from libs.worker.engine import EngineInfo
from libs.worker.errors import InvalidRequest

_DTYPES = {
    "auto": common_pb2.DTYPE_BFLOAT16,
    "bfloat16": common_pb2.DTYPE_BFLOAT16,
    "float16": common_pb2.DTYPE_FLOAT16,
    "float32": common_pb2.DTYPE_FLOAT32,
    "fp8": common_pb2.DTYPE_FP8_E4M3,
    "fp8_e4m3": common_pb2.DTYPE_FP8_E4M3,
    "fp8_e5m2": common_pb2.DTYPE_FP8_E5M2,
    "mxint8": common_pb2.DTYPE_MXINT8,
}


def kv_layout(info: EngineInfo) -> worker_pb2.KvLayout:
    return worker_pb2.KvLayout(
        model_fingerprint=info.model_fingerprint,
        block_size=info.block_size,
        kv_dtype=_DTYPES.get(info.kv_cache_dtype, common_pb2.DTYPE_UNSPECIFIED),
        num_layers=info.num_layers,
        num_kv_heads=info.num_kv_heads,
        head_dim=info.head_dim,
    )


def check_layout(mine: worker_pb2.KvLayout, theirs: worker_pb2.KvLayout) -> None:
    """Refuses a handoff whose KV this engine could not read correctly."""
    if theirs == worker_pb2.KvLayout():
        raise InvalidRequest("KV handoff carries no layout; refusing KV of unknown shape and model")
    differences = [
        f"{field.name}: prefill {getattr(theirs, field.name)!r} vs decode {getattr(mine, field.name)!r}"
        for field in worker_pb2.KvLayout.DESCRIPTOR.fields
        if getattr(theirs, field.name) != getattr(mine, field.name)
    ]
    if differences:
        raise InvalidRequest(
            "KV layout mismatch between prefill and decode workers: " + "; ".join(differences)
        )
