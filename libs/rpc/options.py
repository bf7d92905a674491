"""gRPC channel/server options shared by every Cleave service."""

from __future__ import annotations

from dataclasses import dataclass

# KV chunks are streamed, but one chunk of a large model (256 tokens x 80 layers x 2 x 8 heads
# x 128 dims x 2 bytes = 84 MiB) exceeds gRPC's 4 MiB default by far; 256 MiB leaves room.
DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class RpcOptions:
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    # Keepalive pings detect a peer that vanished without closing the connection (a killed
    # worker behind a NAT or a frozen VM) within seconds rather than the TCP timeout.
    keepalive_time_ms: int = 10_000
    keepalive_timeout_ms: int = 5_000
    # Servers: end each client connection after this long (None: never). Calls open on it
    # finish (no grace limit); new calls go out on a new connection, for which the client
    # resolves the server's name again (gRPC adds +-10% jitter).
    max_connection_age_ms: int | None = None

    def as_grpc_options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.keepalive_time_ms", self.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", self.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            # Servers must accept the clients' keepalive rate or they answer GOAWAY.
            ("grpc.http2.min_ping_interval_without_data_ms", min(self.keepalive_time_ms, 5_000)),
            *(
                [("grpc.max_connection_age_ms", self.max_connection_age_ms)]
                if self.max_connection_age_ms
                else []
            ),
        ]
