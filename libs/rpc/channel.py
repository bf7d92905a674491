"""Client channels: Cleave's message limits, keepalive, request-id propagation, balancing over
every address a name resolves to and, when configured, TLS/mTLS and the shared bearer token
(security.py)."""

from __future__ import annotations

import grpc
import grpc.aio

from libs.rpc.auth import token_client_interceptors, with_token
from libs.rpc.options import RpcOptions
from libs.rpc.request_id import request_id_client_interceptors
from libs.rpc.security import RpcSecurity

# gRPC's own client-side balancing: each call goes to the next of the addresses the target
# resolves to (a headless Service's or compose service's replicas), where the default,
# pick_first, sends every call to the first. One address: the same as pick_first.
BALANCING = ("grpc.lb_policy_name", "round_robin")


def open_channel(
    address: str, options: RpcOptions | None = None, security: RpcSecurity | None = None
) -> grpc.aio.Channel:
    """A channel to `address` (host:port): plaintext unless `security` has TLS material
    (Cleave's services then talk TLS or mTLS to each other), with the token on every call
    when `security` has one."""
    security = security or RpcSecurity()
    grpc_options: list[tuple[str, int | str]] = [
        *(options or RpcOptions()).as_grpc_options(),
        *security.channel_options(),
        BALANCING,
    ]
    interceptors = request_id_client_interceptors()
    if security.token:
        interceptors += token_client_interceptors(security.token)
    credentials = security.channel_credentials()
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=grpc_options, interceptors=interceptors)
    return grpc.aio.secure_channel(address, credentials, options=grpc_options, interceptors=interceptors)


def open_blocking_channel(
    address: str, options: RpcOptions | None = None, security: RpcSecurity | None = None
) -> grpc.Channel:
    """The blocking-API twin of open_channel (no request-id propagation), for code that
    vLLM calls synchronously."""
    security = security or RpcSecurity()
    grpc_options = [*(options or RpcOptions()).as_grpc_options(), *security.channel_options(), BALANCING]
    credentials = security.channel_credentials()
    if credentials is None:
        channel = grpc.insecure_channel(address, options=grpc_options)
    else:
        channel = grpc.secure_channel(address, credentials, options=grpc_options)
    return with_token(channel, security.token) if security.token else channel
