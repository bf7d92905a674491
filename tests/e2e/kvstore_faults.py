"""A kvstore stand-in between a worker and the real kvstore: it forwards every call the
worker's connector makes (Lookup, Get, Put) and, when told, breaks the next Get in one of the
two ways a load can fail — a chunk whose bytes no longer match its checksum, or a stream that
ends after some chunks because the kvstore died (its process is killed at that moment)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc

from cleave.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from libs.rpc.options import RpcOptions


@dataclass(frozen=True)
class _Fault:
    at_chunk: int  # index in the Get stream of the first chunk the fault touches
    kill_kvstore: Callable[[], None] | None = None  # None: corrupt that chunk instead


class FaultyKvStoreProxy(kvstore_pb2_grpc.KvStoreServicer):
    def __init__(self, upstream: str) -> None:
        options = RpcOptions().as_grpc_options()
        self._channel = grpc.insecure_channel(upstream, options=options)
        self._upstream = kvstore_pb2_grpc.KvStoreStub(self._channel)
        self._lock = threading.Lock()
        self._fault: _Fault | None = None
        self.faults_injected = 0
        self._server = grpc.server(ThreadPoolExecutor(max_workers=8), options=options)
        kvstore_pb2_grpc.add_KvStoreServicer_to_server(self, self._server)
        self.address = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def corrupt_next_get(self, at_chunk: int) -> None:
        """The next Get sends chunk `at_chunk` with one byte flipped and its checksum unchanged."""
        with self._lock:
            self._fault = _Fault(at_chunk)

    def kill_kvstore_in_next_get(self, after_chunks: int, kill: Callable[[], None]) -> None:
        """The next Get sends `after_chunks` chunks, then `kill`s the kvstore and fails."""
        with self._lock:
            self._fault = _Fault(after_chunks, kill)

    def stop(self) -> None:
        self._server.stop(grace=None).wait()
        self._channel.close()

    # -- the KvStore service -------------------------------------------------------------
    def Lookup(
        self, request: kvstore_pb2.LookupRequest, context: grpc.ServicerContext
    ) -> kvstore_pb2.LookupResponse:
        try:
            response: kvstore_pb2.LookupResponse = self._upstream.Lookup(
                request, timeout=context.time_remaining()
            )
        except grpc.RpcError as error:
            _relay(error, context)
        return response

    def Put(
        self, request_iterator: Iterator[kvstore_pb2.PutRequest], context: grpc.ServicerContext
    ) -> kvstore_pb2.PutResponse:
        try:
            response: kvstore_pb2.PutResponse = self._upstream.Put(
                request_iterator, timeout=context.time_remaining()
            )
        except grpc.RpcError as error:
            _relay(error, context)
        return response

    def Get(
        self, request: kvstore_pb2.GetRequest, context: grpc.ServicerContext
    ) -> Iterator[kvstore_pb2.GetResponse]:
        with self._lock:
            fault, self._fault = self._fault, None
        try:
            for index, response in enumerate(self._upstream.Get(request, timeout=context.time_remaining())):
                if fault is not None and index == fault.at_chunk:
                    self.faults_injected += 1
                    if fault.kill_kvstore is not None:
                        fault.kill_kvstore()
                        context.abort(grpc.StatusCode.UNAVAILABLE, "the kvstore died mid-load")
                    data = bytearray(response.chunk.kv.data)
                    data[len(data) // 2] ^= 0xFF
                    response.chunk.kv.data = bytes(data)
                yield response
        except grpc.RpcError as error:
            _relay(error, context)


def _relay(error: grpc.RpcError, context: grpc.ServicerContext) -> None:
    code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = error.details() if isinstance(error, grpc.Call) else str(error)
    context.abort(code, details or "")
