"""GenerateMany's gateway side: one long-lived call per worker carries every request's
Generate stream (protos/cleave/worker/v1/worker.proto; the worker's side is
libs/worker/generate_many.py).

Each request gets a `SharedCall` that behaves as the `Generate` call it replaces, so the
pipeline's failure handling stays the same: it yields the request's responses, raises
`grpc.aio.AioRpcError` with the status its own call would have ended with (the worker's
refusal, DEADLINE_EXCEEDED at the request's deadline, or the shared call's own failure for
every request on it when the worker goes away), and `cancel()` stops it on the worker.

Why one call: every gRPC message costs both ends a fixed amount of CPU (grpc.aio's
completion queue, the event-loop wake-up, a socket write that on loopback also delivers),
and after an engine step every request on a worker has a token ready at once. One message per
step for all of them instead of one per request is what gRPC offers no way to do across
calls. Measured (docs/benchmarks.md, 2026-12-05): 4 responses per message at 4 streams, and
the serving layer's CPU per token 7% lower at 4 streams, 16% at 16.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Protocol

import grpc
import grpc.aio
import structlog

from cleave.worker.v1 import worker_pb2
from libs.rpc import draining
from libs.rpc.request_id import REQUEST_ID_METADATA_KEY

log = structlog.get_logger(__name__)

_STATUS = {status.value[0]: status for status in grpc.StatusCode}
_LAST = frozenset({"complete", "error"})
# The shared call is the worker's connection, not one request's: its log lines and the
# worker's say so instead of carrying whichever request opened it.
_CALL_METADATA = ((REQUEST_ID_METADATA_KEY, "generate-many"),)


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


class GenerateCall(Protocol):
    """What the pipeline uses of a Generate call: its responses, and cancel()."""

    def __aiter__(self) -> AsyncIterator[worker_pb2.GenerateResponse]: ...

    def cancel(self) -> bool: ...


# Responses one request may have waiting in the gateway (each is one engine step's tokens of the
# request, a few hundred bytes): a client that reads slower than its worker writes gets this
# much slack, then its request is stopped on the worker and its stream ends with an error,
# so a stalled reader holds at most this much memory and never slows the call the other
# requests share (its items are dropped, not waited for).
MAX_BACKLOG = 1024


class SharedCall:
    """One request on a worker's shared call, used as its own Generate call would be."""

    def __init__(self, connection: _Connection, request_id: str, timeout: float | None) -> None:
        self._connection = connection
        self._request_id = request_id
        self._items: asyncio.Queue[worker_pb2.StreamItem | grpc.aio.AioRpcError] = asyncio.Queue()
        self._ended = False
        self._overflowed = False
        # One timer for the request's deadline (not one per wait for an item): as gRPC does at
        # a call's deadline, the worker stops the request and the caller gets DEADLINE_EXCEEDED.
        self._timer = (
            None
            if timeout is None
            else asyncio.get_running_loop().call_later(max(timeout, 0.0), self._expire)
        )

    def deliver(self, item: worker_pb2.StreamItem | grpc.aio.AioRpcError) -> None:
        if self._overflowed:
            return
        if self._items.qsize() >= MAX_BACKLOG and not isinstance(item, grpc.aio.AioRpcError):
            self._overflowed = True
            log.warning("a client reads too slowly; stopping its request", request_id=self._request_id)
            self._stop_on_worker()
            self._items.put_nowait(
                rpc_error(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the client fell {MAX_BACKLOG} responses behind its stream; the request was stopped",
                )
            )
            return
        self._items.put_nowait(item)

    def __aiter__(self) -> AsyncIterator[worker_pb2.GenerateResponse]:
        return self._responses()

    async def _responses(self) -> AsyncIterator[worker_pb2.GenerateResponse]:
        try:
            while True:
                item = await self._items.get()
                if isinstance(item, grpc.aio.AioRpcError):
                    self._ended = True
                    raise item
                if item.HasField("status"):
                    self._ended = True
                    self._connection.forget(self._request_id)
                    code = _STATUS.get(item.status.code, grpc.StatusCode.UNKNOWN)
                    if code is grpc.StatusCode.OK:
                        return
                    raise rpc_error(code, item.status.message)
                if item.response.WhichOneof("kind") in _LAST:
                    self._ended = True  # the worker sends nothing more for it
                    self._connection.forget(self._request_id)
                    yield item.response
                    return
                yield item.response
        finally:
            if self._timer is not None:
                self._timer.cancel()

    def _expire(self) -> None:
        if self._stop_on_worker():
            self._items.put_nowait(rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))

    def _stop_on_worker(self) -> bool:
        if self._ended:
            return False
        self._ended = True
        self._connection.cancel(self._request_id)
        return True

    def cancel(self) -> bool:
        """Stops the request on the worker (its engine aborts it); False once it has ended."""
        if self._timer is not None:
            self._timer.cancel()
        return self._stop_on_worker()


class _Connection:
    """One GenerateMany call and the requests started on it. When the call fails, every
    request on it fails with the call's status, as each one's own call would have."""

    def __init__(
        self,
        stub: Any,
        address: str,
        closed: Callable[[_Connection], None],
        on_inflight: Callable[[int], None] | None = None,
    ) -> None:
        self._address = address
        self._closed = closed
        self._on_inflight = on_inflight
        self._call = stub.GenerateMany(metadata=_CALL_METADATA)
        self._requests: dict[str, SharedCall] = {}
        self._lock = asyncio.Lock()  # grpc.aio allows one write at a time per call
        self._tasks: set[asyncio.Task[None]] = set()
        self._spawn(self._read())

    def start(self, request: worker_pb2.GenerateRequest, timeout: float | None) -> SharedCall:
        request_id = request.metadata.request_id
        call = SharedCall(self, request_id, timeout)
        if request_id in self._requests:
            # Only a bug could reuse a running id; this call must not take the other's items.
            call.deliver(rpc_error(grpc.StatusCode.INTERNAL, f"request id {request_id!r} is already running"))
            return call
        self._requests[request_id] = call
        self._spawn(self._write(worker_pb2.GenerateManyRequest(start=request)))
        return call

    def forget(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def cancel(self, request_id: str) -> None:
        if self._requests.pop(request_id, None) is not None:
            self._spawn(self._write(worker_pb2.GenerateManyRequest(cancel=request_id)))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(self, message: worker_pb2.GenerateManyRequest) -> None:
        try:
            async with self._lock:
                await self._call.write(message)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as error:
            # The call has failed or closed: _read fails its requests with the call's status.
            log.debug("generate_many write failed", address=self._address, error=str(error))

    async def _read(self) -> None:
        failure: grpc.aio.AioRpcError
        ended = False  # by the worker, with its status OK
        try:
            while True:
                response = await self._call.read()
                if response is grpc.aio.EOF:
                    ended = True
                    # A worker ends the call itself only when it drains and nothing runs on it:
                    # a start it had not read yet never ran (libs/rpc/draining.py).
                    failure = rpc_error(
                        grpc.StatusCode.UNAVAILABLE,
                        draining.message("the worker closed its GenerateMany call"),
                    )
                    break
                for item in response.items:
                    call = self._requests.get(item.request_id)
                    if call is not None:
                        call.deliver(item)
                if self._on_inflight is not None:
                    self._on_inflight(response.num_inflight)
        except grpc.aio.AioRpcError as error:
            failure = error
        except asyncio.CancelledError:
            self._fail(rpc_error(grpc.StatusCode.CANCELLED, "the gateway closed its GenerateMany call"))
            raise
        self._fail(failure)
        if ended:
            # The worker ended the call: end this side's writes too, or grpc.aio's intercepted
            # call keeps a task waiting for writes for ever (destroyed pending when collected).
            with contextlib.suppress(grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
                async with self._lock:
                    await self._call.done_writing()

    def _fail(self, failure: grpc.aio.AioRpcError) -> None:
        self._closed(self)
        requests, self._requests = self._requests, {}
        if requests:
            log.warning(
                "generate_many call failed",
                address=self._address,
                code=failure.code().name,
                requests=len(requests),
            )
        for call in requests.values():
            call.deliver(failure)


class SharedStream:
    """A worker's GenerateMany call for every request sent to it, opened on first use and
    again after it fails. Closing the endpoint's channel ends it (WorkerPool.close, retire)."""

    def __init__(self, stub: Any, address: str, on_inflight: Callable[[int], None] | None = None) -> None:
        self._stub = stub
        self._address = address
        # Told the worker's count of running requests each message carries (all gateways').
        self._on_inflight = on_inflight
        self._connection: _Connection | None = None

    def open(self, request: worker_pb2.GenerateRequest, timeout: float | None) -> SharedCall:
        """Starts `request` (its metadata.request_id set) and returns its call."""
        if self._connection is None:
            self._connection = _Connection(
                self._stub, self._address, self._connection_closed, self._on_inflight
            )
        return self._connection.start(request, timeout)

    def _connection_closed(self, connection: _Connection) -> None:
        if self._connection is connection:
            self._connection = None
