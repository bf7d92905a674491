"""A blocking kvstore client for code that runs inside vLLM's engine process.

vLLM calls connectors synchronously from its scheduler loop and model runner, so this
client is the sync gRPC API over one channel. Every failure becomes KvStoreUnavailable with
the gRPC status in its message; callers fall back to recomputing, never fail a request.
Lookup and Get (which the engine waits on) each have one deadline, `timeout_s` for the whole
call however many chunks it streams, so a slow kvstore delays an engine step by at most
that; Put runs in the background saver and gets `timeout_s` per chunk.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import grpc

from cleave.common.v1 import common_pb2
from cleave.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from libs.kvconnector.plan import LookupResult
from libs.rpc.channel import open_blocking_channel
from libs.rpc.security import RpcSecurity


class KvStoreUnavailable(Exception):
    """The kvstore did not answer (down, too slow, or refused the call)."""


class KvStoreClient:
    def __init__(
        self,
        address: str,
        layout: common_pb2.KvLayout,
        timeout_s: float,
        security: RpcSecurity | None = None,
    ) -> None:
        self.address = address
        self._layout = layout
        self._timeout_s = timeout_s
        # TLS/mTLS and the token as the worker's --grpc-* flags say (the kvstore checks them).
        self._channel = open_blocking_channel(address, security=security)
        self._stub = kvstore_pb2_grpc.KvStoreStub(self._channel)

    def lookup(
        self,
        request_id: str,
        token_ids: Sequence[int],
        cache_salt: str = "",
        lora: common_pb2.LoraAdapter | None = None,
    ) -> LookupResult:
        """How much of the prompt the kvstore holds under `cache_salt` and `lora`, and every
        chunk's key (salted keys for a salted or adapter's request: what is loaded and saved
        under them)."""
        request = kvstore_pb2.LookupRequest(
            metadata=common_pb2.RequestMetadata(request_id=request_id, cache_salt=cache_salt, lora=lora),
            token_ids=token_ids,
            layout=self._layout,
        )
        try:
            response = self._stub.Lookup(request, timeout=self._timeout_s)
        except grpc.RpcError as error:
            raise _unavailable("Lookup", error) from None
        return LookupResult(matched_tokens=response.matched_tokens, keys=tuple(response.keys))

    def get(self, request_id: str, keys: Sequence[kvstore_pb2.ChunkKey]) -> Iterator[kvstore_pb2.KvChunk]:
        """The chunks for `keys`, in order; the stream ends early at the first missing one."""
        request = kvstore_pb2.GetRequest(
            metadata=common_pb2.RequestMetadata(request_id=request_id), keys=keys
        )
        try:
            for response in self._stub.Get(request, timeout=self._timeout_s):
                yield response.chunk
        except grpc.RpcError as error:
            raise _unavailable("Get", error) from None

    def put(self, request_id: str, chunks: Sequence[kvstore_pb2.KvChunk]) -> kvstore_pb2.PutResponse:
        metadata = common_pb2.RequestMetadata(request_id=request_id)
        messages = (kvstore_pb2.PutRequest(metadata=metadata, layout=self._layout, chunk=c) for c in chunks)
        try:
            response: kvstore_pb2.PutResponse = self._stub.Put(
                messages, timeout=self._timeout_s * (1 + len(chunks))
            )
        except grpc.RpcError as error:
            raise _unavailable("Put", error) from None
        return response

    def close(self) -> None:
        self._channel.close()


def _unavailable(method: str, error: grpc.RpcError) -> KvStoreUnavailable:
    code = error.code() if isinstance(error, grpc.Call) else None
    details = error.details() if isinstance(error, grpc.Call) else str(error)
    name = code.name if code is not None else "UNKNOWN"
    return KvStoreUnavailable(f"kvstore {method} failed: {name}: {details}")
