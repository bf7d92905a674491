"""Calling a fuzzed gRPC servicer: every call is answered, or refused with a status that puts
the fault on the caller (a servicer's own failure, UNKNOWN or INTERNAL, fails the test)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import grpc

from tests.fuzz.events import outcome


class Caller:
    def __init__(self, refusals: Collection[grpc.StatusCode], timeout_s: float = 30) -> None:
        self.refusals = refusals
        self.timeout_s = timeout_s

    def unary(self, method: Callable[..., Any], request: Any) -> Any:
        """The response, or None when refused as the caller's fault; anything else fails."""
        try:
            response = method(request, timeout=self.timeout_s)
        except grpc.RpcError as error:
            self.refused(error, request)
            return None
        outcome("answered")
        return response

    def refused(self, error: grpc.RpcError, request: Any) -> None:
        code, details = error.code(), error.details() or ""
        outcome(f"refused {code.name}")
        assert code in self.refusals, f"{code} {details!r} for {str(request)[:2000]}"
        assert "Traceback" not in details
