"""vLLM NixlConnector `kv_transfer_params` <-> the contract's typed KvHandoff."""

from __future__ import annotations

from typing import Any

from cleave.worker.v1 import worker_pb2

NIXL = "nixl"


def handoff_from_params(
    params: dict[str, Any], *, lease_expires_unix_ms: int, worker_address: str
) -> worker_pb2.KvHandoff:
    """From what a prefill request's output carries (its `kv_transfer_params`)."""
    missing = [
        k for k in ("remote_engine_id", "remote_host", "remote_port", "remote_block_ids") if k not in params
    ]
    if missing:
        raise ValueError(f"prefill returned kv_transfer_params without {missing}: {sorted(params)}")
    groups = params["remote_block_ids"]
    if groups and isinstance(groups[0], int):  # older vLLMs: one flat list
        groups = [groups]
    return worker_pb2.KvHandoff(
        transport=NIXL,
        engine_id=str(params["remote_engine_id"]),
        host=str(params["remote_host"]),
        port=int(params["remote_port"]),
        block_ids=[worker_pb2.BlockIds(ids=[int(b) for b in group]) for group in groups],
        remote_request_id=str(params.get("remote_request_id") or ""),
        tp_size=int(params.get("tp_size") or 1),
        pp_size=int(params.get("pp_size") or 1),
        dcp_size=int(params.get("dcp_size") or 1),
        num_tokens=int(params.get("remote_num_tokens") or 0),
        prefill_cached_tokens=int(params.get("remote_prefill_cached_tokens") or 0),
        transfer_mode=str(params.get("transfer_mode") or "pull"),
        lease_expires_unix_ms=lease_expires_unix_ms,
        worker_address=worker_address,
    )


def params_from_handoff(handoff: worker_pb2.KvHandoff) -> dict[str, Any]:
    """What a decode request must carry for vLLM to pull the KV instead of computing it."""
    if handoff.transport != NIXL:
        raise ValueError(f"unsupported KV transport {handoff.transport!r}; this worker speaks {NIXL!r}")
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": handoff.engine_id,
        "remote_host": handoff.host,
        "remote_port": handoff.port,
        "remote_block_ids": [list(group.ids) for group in handoff.block_ids],
        "remote_request_id": handoff.remote_request_id,
        "tp_size": handoff.tp_size,
        "pp_size": handoff.pp_size,
        "dcp_size": handoff.dcp_size,
        "remote_num_tokens": handoff.num_tokens,
        "remote_prefill_cached_tokens": handoff.prefill_cached_tokens,
        "transfer_mode": handoff.transfer_mode or "pull",
    }


# What a prefill request carries so that vLLM keeps the KV for a remote decode.
PREFILL_PARAMS: dict[str, Any] = {"do_remote_decode": True}
