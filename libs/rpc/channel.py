"""Client channels: Cleave's message limits, keepalive and request-id propagation."""

from __future__ import annotations

import grpc.aio

from libs.rpc.options import RpcOptions
from libs.rpc.request_id import request_id_client_interceptors


def open_channel(address: str, options: RpcOptions | None = None) -> grpc.aio.Channel:
    """An insecure channel to `address` (host:port). Cleave's services talk on a trusted
    network or loopback; TLS termination belongs to the gateway's ingress."""
    return grpc.aio.insecure_channel(
        address,
        options=(options or RpcOptions()).as_grpc_options(),
        interceptors=request_id_client_interceptors(),
    )
