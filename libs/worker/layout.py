"""The worker's KV layout checks: KV computed under one layout is garbage under another, so a
decode worker refuses a handoff whose layout differs from its own."""

from __future__ import annotations

from cleave.common.v1 import common_pb2
from libs.kvlayout.layout import kv_layout as layout_of
from libs.worker.engine import EngineInfo
from libs.worker.errors import InvalidRequest


def kv_layout(info: EngineInfo) -> common_pb2.KvLayout:
    """This engine's layout, for handoffs and GetInfo: the same function and facts the kvstore
    connector keys chunks by (libs/kvlayout)."""
    return layout_of(info.kv)


def check_layout(mine: common_pb2.KvLayout, theirs: common_pb2.KvLayout) -> None:
    """Refuses a handoff whose KV this engine could not read correctly."""
    if theirs == common_pb2.KvLayout():
        raise InvalidRequest("KV handoff carries no layout; refusing KV of unknown shape and model")
    differences = [
        f"{field.name}: prefill {getattr(theirs, field.name)!r} vs decode {getattr(mine, field.name)!r}"
        for field in common_pb2.KvLayout.DESCRIPTOR.fields
        if getattr(theirs, field.name) != getattr(mine, field.name)
    ]
    if differences:
        raise InvalidRequest(
            "KV layout mismatch between prefill and decode workers: " + "; ".join(differences)
        )
