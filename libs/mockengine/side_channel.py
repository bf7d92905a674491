"""The mock's stand-in for NIXL between a prefill core and a decode core.

A prefill core serves a small TCP endpoint on the worker's KV host and port (the
`remote_host` / `remote_port` of its handoff descriptors). A decode core "pulls" a handed-over
prompt by asking it: the prefill side checks the engine id, the request id and its lease,
ends the lease (its blocks go back to the pool, still cached) and answers OK, or refuses
(unknown, expired, released, already pulled, or a fault). The bytes themselves are not
sent: the decode side waits the simulated transfer time instead. ReleaseKv uses the same
endpoint. One request per connection: a length-prefixed msgpack frame each way.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any

import msgspec

_LENGTH = struct.Struct(">I")
MAX_FRAME = 64 * 1024


class PullKv(msgspec.Struct, tag=True):  # type: ignore[call-arg]
    engine_id: str
    request_id: str


class ReleaseKv(msgspec.Struct, tag=True):  # type: ignore[call-arg]
    engine_id: str
    request_id: str


class SideReply(msgspec.Struct):
    ok: bool
    reason: str = ""


SideRequest = PullKv | ReleaseKv
_decode_request: Any = msgspec.msgpack.Decoder(SideRequest)
_decode_reply = msgspec.msgpack.Decoder(SideReply)
_encode = msgspec.msgpack.Encoder()


class SideChannelError(Exception):
    """The pull or release could not be done; the message says why."""


async def _write(writer: asyncio.StreamWriter, message: msgspec.Struct) -> None:
    body = _encode.encode(message)
    writer.write(_LENGTH.pack(len(body)) + body)
    await writer.drain()


async def _read(reader: asyncio.StreamReader) -> bytes:
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if length > MAX_FRAME:
        raise ValueError(f"side-channel frame of {length} bytes")
    return await reader.readexactly(length)


Handler = Callable[[SideRequest], SideReply]


async def serve(host: str, port: int, handler: Handler) -> asyncio.Server:
    """Serves pulls and releases; `handler` answers each (synchronously, on the loop)."""

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = _decode_request.decode(await _read(reader))
            await _write(writer, handler(request))
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, msgspec.DecodeError):
            pass  # a peer that went away or spoke nonsense gets nothing
        finally:
            writer.close()

    return await asyncio.start_server(on_connection, host, port)


async def ask(host: str, port: int, request: SideRequest, *, timeout_s: float) -> None:
    """Sends one pull or release; raises SideChannelError unless the peer answers OK."""
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                await _write(writer, request)
                reply = _decode_reply.decode(await _read(reader))
            finally:
                writer.close()
    except TimeoutError:
        raise SideChannelError(
            f"no answer from the prefill engine at {host}:{port} within {timeout_s}s"
        ) from None
    except (OSError, asyncio.IncompleteReadError, ValueError, msgspec.DecodeError) as error:
        raise SideChannelError(f"cannot reach the prefill engine at {host}:{port}: {error}") from None
    if not reply.ok:
        raise SideChannelError(f"the prefill engine refused: {reply.reason}")
