"""vLLM NixlConnector `kv_transfer_params` <-> the contract's typed KvHandoff, and the checks
a decode worker makes before it acts on a descriptor it was sent.

A descriptor names a host and port that vLLM's NIXL connector will connect to and pull KV
from (or, for ReleaseKv, notify). Whoever can call a decode worker could otherwise point it
at any machine, or at KV that no prefill is holding. So a descriptor must carry a lease
(every prefill sets one; a missing one means it was not made by a prefill) that has not
expired, and its host must be one the worker was told to trust: loopback, the worker's own
--kv-host (a prefill on the same machine), one of --kv-allowed-hosts, or an address of a
--kv-allowed-dns name (peers.py: on Kubernetes, the prefill workers' headless Service). Host
names in --kv-allowed-hosts are compared as written, without DNS; an entry written as a network
(`10.244.0.0/16`) trusts every address in it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

from cleave.worker.v1 import worker_pb2
from libs.rpc.errors import FailedPrecondition
from libs.worker.errors import InvalidRequest, KvTransferFailed

NIXL = "nixl"


class UntrustedPeer(FailedPrecondition):
    """The descriptor's NIXL peer is not a host this worker was told to pull from: a forged
    descriptor, or a deployment whose --kv-allowed-hosts lacks a prefill host (so not the
    client's mistake: FAILED_PRECONDITION, not INVALID_ARGUMENT)."""


# A lease further ahead than this was not granted by any prefill (leases last seconds).
MAX_LEASE_AHEAD_S = 3600.0


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
    """What a decode request must carry for vLLM to pull the KV instead of computing it
    (InvalidRequest: a transport this worker does not speak)."""
    if handoff.transport != NIXL:
        raise InvalidRequest(f"unsupported KV transport {handoff.transport!r}; this worker speaks {NIXL!r}")
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


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def trusted_hosts(kv_host: str, allowed: Iterable[str]) -> frozenset[str]:
    """Hosts (besides loopback) a decode worker accepts in a descriptor."""
    return frozenset(h.lower() for h in (kv_host, *allowed) if h)


def check_peer(
    handoff: worker_pb2.KvHandoff, trusted: frozenset[str], resolved: frozenset[str] = frozenset()
) -> None:
    """Raises UntrustedPeer unless the descriptor's NIXL peer is a host this worker trusts;
    `resolved`: the addresses of its --kv-allowed-dns names (peers.py)."""
    host = handoff.host
    if not host:  # malformed, not forged: the caller's mistake
        raise InvalidRequest("KV handoff names no host")
    if not (
        is_loopback(host)
        or host.lower() in trusted
        or host.strip("[]").lower() in resolved
        or _in_trusted_network(host, trusted)
    ):
        raise UntrustedPeer(
            f"KV handoff names host {host!r}, which this worker does not pull from "
            "(loopback, its --kv-host, --kv-allowed-hosts and the addresses of --kv-allowed-dns)"
        )
    if not 0 < handoff.port < 65536:
        raise InvalidRequest(f"KV handoff names port {handoff.port}, not 1..65535")


def _in_trusted_network(host: str, trusted: frozenset[str]) -> bool:
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False  # a name matches only as written
    return any(address in ipaddress.ip_network(entry, strict=False) for entry in trusted if "/" in entry)


def check_arrival(handoff: worker_pb2.KvHandoff, now_s: float) -> None:
    """Raises KvTransferFailed when the engine's first output for a handed-over prompt came
    after the lease ended. The pull precedes that output, so it may have read blocks the
    prefill engine had already freed (vLLM's prefill side then logs "potentially invalid KV
    blocks ... retrieved by a decode worker"; the decode side says nothing). Seen when the
    decode engine was too busy to pull within the lease (the first request through a draft
    model straddling a prefill core took 34 s against a 30 s lease). A first output in time
    means the pull was too; later ones need no check."""
    if now_s * 1000 >= handoff.lease_expires_unix_ms:
        raise KvTransferFailed(
            f"the handed-over KV arrived {now_s - handoff.lease_expires_unix_ms / 1000:.1f}s after its "
            "lease expired (the prefill worker may have reused the blocks); prefill again"
        )


def check_lease(handoff: worker_pb2.KvHandoff, now_s: float) -> None:
    """Raises InvalidRequest for a descriptor without a believable lease, KvTransferFailed
    for one whose lease ran out (vLLM may have reused the blocks: pulling them would yield
    wrong tokens with no error anywhere on the decode side)."""
    expires_ms = handoff.lease_expires_unix_ms
    if expires_ms <= 0:
        raise InvalidRequest("KV handoff carries no lease; only a prefill's handoff is accepted")
    if expires_ms / 1000 > now_s + MAX_LEASE_AHEAD_S:
        raise InvalidRequest("KV handoff's lease ends implausibly far in the future")
    if now_s * 1000 >= expires_ms:
        raise KvTransferFailed(
            f"the KV handoff's lease expired {now_s - expires_ms / 1000:.1f}s ago; prefill again"
        )
