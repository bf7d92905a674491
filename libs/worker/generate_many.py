"""GenerateMany's worker side: many requests' Generate streams carried on one gRPC call.

Why: every gRPC message costs the worker and the gateway a fixed amount of CPU (grpc.aio's
completion queue, the event-loop wake-up, a socket write). vLLM's output handler wakes every
running request in the same loop iteration after an engine step, so their responses land in
the outbox together and leave as one message. gRPC has no batching of its own across calls,
which is the gap this fills (measured in docs/benchmarks.md, 2026-12-05).

Each request runs exactly as its own Generate call would (`run_one`, the servicer's stream);
this module only multiplexes: starts, cancels, and the typed end of each request. A draining
worker (drain.py) refuses new starts like any new request; the call ends once the requests
it carries have, so that it does not hold up the server's stop (the gateway opens another
call on its next request, and takes the end, with nothing running on it, as a drain).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from contextlib import aclosing

import grpc
import structlog

from cleave.worker.v1 import worker_pb2
from libs.observability.logging import bind_request_id
from libs.rpc.options import DEFAULT_MAX_MESSAGE_BYTES
from libs.worker import metrics
from libs.worker.drain import DrainState

log = structlog.get_logger(__name__)

# A request's own Generate stream. It raises what failed it when nothing was streamed yet
# (the call would have ended with that status); later failures are its `error` response.
RunOne = Callable[[worker_pb2.GenerateRequest], AsyncGenerator[worker_pb2.GenerateResponse, None]]
# The status a Generate call ends with for an exception (the servicer's mapping; it logs).
Refusal = Callable[[BaseException], tuple[grpc.StatusCode, str]]

_LAST = frozenset({"complete", "error"})
# Room for a message's own framing around its items.
_MESSAGE_OVERHEAD_BYTES = 1024


class GenerateMany:
    """One GenerateMany call: reads starts and cancels, runs each request in its own task,
    and streams whatever responses are ready, together."""

    def __init__(
        self,
        run_one: RunOne,
        refusal: Refusal,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        drain: DrainState | None = None,
        inflight: Callable[[], int] = lambda: 0,
    ) -> None:
        self._drain = drain
        # The worker's count of running requests (capacity.py), sent with every message.
        self._inflight = inflight
        self._run_one = run_one
        self._refusal = refusal
        self._max_bytes = max_message_bytes - _MESSAGE_OVERHEAD_BYTES
        self._outbox: list[tuple[worker_pb2.StreamItem, int]] = []  # with each item's size
        self._ready = asyncio.Event()
        self._running: dict[str, asyncio.Task[None]] = {}  # by request id, until its last item
        self._tasks: set[asyncio.Task[None]] = set()  # every request's task until it returns

    async def serve(
        self, requests: AsyncIterator[worker_pb2.GenerateManyRequest]
    ) -> AsyncIterator[worker_pb2.GenerateManyResponse]:
        reader = asyncio.create_task(self._read(requests))
        unsubscribe = self._drain.subscribe(self._ready.set) if self._drain is not None else None
        try:
            while True:
                await self._ready.wait()
                self._ready.clear()
                if self._outbox:
                    ready, self._outbox = self._outbox, []
                    for items in self._messages(ready):
                        metrics.GENERATE_MANY_ITEMS.observe(len(items))
                        yield worker_pb2.GenerateManyResponse(items=items, num_inflight=self._inflight())
                if reader.done() and not self._running and not self._outbox:
                    reader.result()  # the caller's stream failing fails this call
                    return
                if self._drained():
                    return  # nothing runs on this call any more, and nothing will
        finally:
            if unsubscribe is not None:
                unsubscribe()
            # The caller went away or closed the call: its requests stop (engine aborts).
            reader.cancel()
            for task in list(self._tasks):
                task.cancel()

    def _messages(
        self, ready: list[tuple[worker_pb2.StreamItem, int]]
    ) -> Iterator[list[worker_pb2.StreamItem]]:
        """The ready items in as few messages as the message size limit allows."""
        items: list[worker_pb2.StreamItem] = []
        total = 0
        for item, size in ready:
            if items and total + size > self._max_bytes:
                yield items
                items, total = [], 0
            items.append(item)
            total += size
        if items:
            yield items

    async def _read(self, requests: AsyncIterator[worker_pb2.GenerateManyRequest]) -> None:
        try:
            async for message in requests:
                kind = message.WhichOneof("kind")
                if kind == "start":
                    self._start(message.start)
                elif kind == "cancel":
                    task = self._running.pop(message.cancel, None)
                    if task is not None:
                        task.cancel()
        finally:
            self._ready.set()  # serve() checks whether everything has ended

    def _start(self, request: worker_pb2.GenerateRequest) -> None:
        request_id = request.metadata.request_id
        if not request_id or request_id in self._running:
            reason = "is already running on this call" if request_id else "is required on GenerateMany"
            self._end(request_id, grpc.StatusCode.INVALID_ARGUMENT, f"request id {request_id!r} {reason}")
            return
        task = asyncio.create_task(self._run(request_id, request))
        self._running[request_id] = task
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._drain is not None and self._drain.draining:
            self._ready.set()  # serve() checks whether the call is drained

    def _drained(self) -> bool:
        """Draining, and every request of this call has ended (its task too)."""
        return (
            self._drain is not None
            and self._drain.draining
            and not self._running
            and not self._outbox
            and not self._tasks
        )

    async def _run(self, request_id: str, request: worker_pb2.GenerateRequest) -> None:
        bind_request_id(request_id)  # this task's own context: its log lines carry the id
        ended = False
        try:
            async with aclosing(self._run_one(request)) as responses:
                async for response in responses:
                    item = worker_pb2.StreamItem(request_id=request_id, response=response)
                    size = item.ByteSize()
                    if size > self._max_bytes:
                        # On a call of its own this would fail that call alone; here it would
                        # fail the call every request shares. Closing the stream aborts it.
                        self._running.pop(request_id, None)
                        self._end(
                            request_id,
                            grpc.StatusCode.INVALID_ARGUMENT,
                            f"a response of {size} bytes exceeds the {self._max_bytes}-byte message "
                            "limit; ask for fewer logprobs",
                        )
                        return
                    ended = response.WhichOneof("kind") in _LAST
                    if ended:
                        # The contract's end: the caller forgets the id, which may start again.
                        self._running.pop(request_id, None)
                    self._put(item, size)
            if not ended:
                self._running.pop(request_id, None)
                self._end(request_id, grpc.StatusCode.OK, "the stream ended without completing")
        except asyncio.CancelledError:
            raise  # cancelled by the caller, who expects nothing more of it
        except Exception as error:
            if ended:
                log.exception("generate_many: a request failed after its last response")
            else:
                self._running.pop(request_id, None)
                self._end(request_id, *self._refusal(error))

    def _end(self, request_id: str, code: grpc.StatusCode, message: str) -> None:
        status = worker_pb2.StreamStatus(code=code.value[0], message=message)
        item = worker_pb2.StreamItem(request_id=request_id, status=status)
        self._put(item, item.ByteSize())

    def _put(self, item: worker_pb2.StreamItem, size: int) -> None:
        self._outbox.append((item, size))
        self._ready.set()
