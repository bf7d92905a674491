"""One deadline per request (`--request-timeout`), fixed when the request arrives and given to
every gRPC call it makes as that call's timeout: the time left, never a fixed per-hop budget.

gRPC carries the deadline to the server, so when it passes the worker's call is cancelled and
the worker aborts the request in its engine (as when a client goes away); the client gets a
504 (`errors.request_timeout`). The deadline also bounds the time a request waits for a worker
in the admission queue (libs/gateway/fleet/admission.py).

Where it is fixed: `RequestDeadline` (api/http/request_deadline.py), an ASGI middleware, binds it to the request's context
when the request arrives, so the tokenizer calls made before the serving room runs (chat template,
tokenize) count against it too; `Serving.generate` fixes one itself when none is bound (a caller
without the middleware). `DeadlineStub` puts the bound deadline on every call of a stub
that does not pass a shorter timeout itself (the tokenizer's: its calls are made in several
modules, and none has to know about deadlines).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from libs.gateway.common import errors

_CURRENT: ContextVar[Deadline | None] = ContextVar("cleave_gateway_request_deadline", default=None)


@dataclass(frozen=True)
class Deadline:
    expires_at: float | None  # time.monotonic(); None: no limit
    budget_s: float | None  # the timeout it was fixed with, for messages

    @classmethod
    def after(cls, timeout_s: float | None) -> Deadline:
        """A deadline `timeout_s` from now; None or 0 means none."""
        if not timeout_s:
            return cls(None, None)
        return cls(time.monotonic() + timeout_s, timeout_s)

    def remaining(self) -> float | None:
        """Seconds left (may be negative), or None without a limit."""
        return None if self.expires_at is None else self.expires_at - time.monotonic()

    def expired(self) -> bool:
        remaining = self.remaining()
        return remaining is not None and remaining <= 0

    def timeout(self, cap_s: float | None = None) -> float | None:
        """The timeout for the next gRPC call: the time left, at most `cap_s`; raises the 504
        when none is left (a call with timeout 0 would fail anyway, and blame the worker)."""
        if self.expired():
            raise self.exceeded()
        return self.grpc_timeout(cap_s)

    def grpc_timeout(self, cap_s: float | None = None) -> float | None:
        """As `timeout`, but never raises: with no time left the call gets 1 ms and fails with
        DEADLINE_EXCEEDED, which the caller maps to the 504 (for code that must not raise
        between taking and releasing a resource)."""
        remaining = self.remaining()
        if remaining is None:
            return cap_s
        remaining = max(remaining, 0.001)
        return remaining if cap_s is None else min(remaining, cap_s)

    def exceeded(self) -> errors.ApiError:
        return errors.request_timeout(self.budget_s)


NO_DEADLINE = Deadline(None, None)


def current() -> Deadline | None:
    """The deadline bound to the running request, if any."""
    return _CURRENT.get()


@contextmanager
def bound(deadline: Deadline) -> Iterator[None]:
    """Binds `deadline` to the running context (a request's) while the block runs."""
    token = _CURRENT.set(deadline)
    try:
        yield
    finally:
        _CURRENT.reset(token)


class DeadlineStub:
    """A gRPC stub whose every call gets the bound request deadline's time left as its
    timeout (or its own shorter one). Wraps the tokenizer's stub: its calls are made in
    several modules, and none of them has to know about deadlines."""

    def __init__(self, stub: Any) -> None:
        self._stub = stub

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._stub, name)

        def call(request: Any, *, timeout: float | None = None, **options: Any) -> Any:
            deadline = current()
            if deadline is None or deadline.expires_at is None:
                if timeout is not None:
                    options["timeout"] = timeout
                return method(request, **options)
            # Never raises here: a stream opened in a constructor (the detokenizer's) must not
            # fail before its owner can clean up; a call with no time left fails at once.
            call = method(request, timeout=deadline.grpc_timeout(timeout), **options)
            if isinstance(call, grpc.aio.UnaryUnaryCall):
                return _answer(call, deadline)
            return call

        return call


async def _answer(call: grpc.aio.UnaryUnaryCall, deadline: Deadline) -> Any:
    """A unary call's answer; its timeout is the request's 504 once the request's time is up
    (not the called service's failure)."""
    try:
        return await call
    except grpc.aio.AioRpcError as error:
        if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and deadline.expired():
            raise deadline.exceeded() from error
        raise
