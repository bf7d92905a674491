"""Cleave's error types and the one mapping from them to gRPC status codes, shared by every
servicer: library code raises an `RpcError` subclass that says whose fault it is, and the
servicer hands whatever it caught to `abort` (unary calls) or `stream_error` (streams that
end with a typed `Error`).

Anything that is not an `RpcError` is a bug or a crash on the server's side: INTERNAL,
logged with its traceback, and answered with a fixed message so that nothing internal (paths,
addresses, secrets in a connection string) reaches the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NoReturn

import grpc
import grpc.aio
import structlog

from cleave.common.v1 import common_pb2

log = structlog.get_logger(__name__)


class RpcError(Exception):
    """An error whose class decides the gRPC status the caller gets; the message is shown."""

    status: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL
    code: ClassVar[common_pb2.ErrorCode] = common_pb2.ERROR_CODE_INTERNAL


class InvalidRequest(RpcError, ValueError):
    """The request can never succeed as sent: the caller's mistake, never the server's."""

    status = grpc.StatusCode.INVALID_ARGUMENT
    code = common_pb2.ERROR_CODE_INVALID_ARGUMENT


class NotFound(RpcError):
    """What the request names does not exist (a LoRA adapter's path): the caller's mistake."""

    status = grpc.StatusCode.NOT_FOUND
    code = common_pb2.ERROR_CODE_INVALID_ARGUMENT


class FailedPrecondition(RpcError):
    """The request is well formed but this server is not set up for it (wrong role, no chat
    template): sending it elsewhere may work, retrying here will not."""

    status = grpc.StatusCode.FAILED_PRECONDITION
    code = common_pb2.ERROR_CODE_INVALID_ARGUMENT


class Unavailable(RpcError):
    """The server cannot serve now (starting, stopping, its engine dead): try another one."""

    status = grpc.StatusCode.UNAVAILABLE
    code = common_pb2.ERROR_CODE_OVERLOADED


class AtCapacity(RpcError):
    """The server runs as many requests as it takes at once (libs/rpc/at_capacity.py): nothing
    of this one ran, and it may be sent again once one ends, here or elsewhere."""

    status = grpc.StatusCode.RESOURCE_EXHAUSTED
    code = common_pb2.ERROR_CODE_OVERLOADED


class Aborted(RpcError):
    """This attempt failed in a way a fresh attempt may not (e.g. handed-over KV was lost)."""

    status = grpc.StatusCode.ABORTED
    code = common_pb2.ERROR_CODE_ABORTED


@dataclass(frozen=True)
class Failure:
    status: grpc.StatusCode
    code: common_pb2.ErrorCode
    message: str


def internal_message(service: str) -> str:
    return f"internal error in the {service} service"


def classify(error: BaseException, service: str) -> Failure:
    """The status, stream error code and caller-safe message for an exception."""
    if isinstance(error, RpcError):
        return Failure(error.status, error.code, str(error) or type(error).__name__)
    return Failure(grpc.StatusCode.INTERNAL, common_pb2.ERROR_CODE_INTERNAL, internal_message(service))


def _log(failure: Failure, service: str, method: str) -> None:
    if failure.status is grpc.StatusCode.INTERNAL:
        log.exception("rpc failed", service=service, method=method)
    else:
        log.info(
            "rpc refused", service=service, method=method, status=failure.status.name, reason=failure.message
        )


async def abort(
    context: grpc.aio.ServicerContext, error: BaseException, *, service: str, method: str
) -> NoReturn:
    """Ends a call with the status `error` maps to. Call it from an `except` block."""
    failure = refusal(error, service=service, method=method)
    await context.abort(failure.status, failure.message)
    raise AssertionError("context.abort returned")  # it raises; this keeps mypy honest


def refusal(error: BaseException, *, service: str, method: str) -> Failure:
    """The status a call ends with for `error`, logged as `abort` logs it (for calls that
    carry several requests and end each one with a status of its own)."""
    failure = classify(error, service)
    _log(failure, service, method)
    return failure


def stream_error(error: BaseException, *, service: str, method: str) -> common_pb2.Error:
    """The typed `Error` a stream ends with, for contracts that promise complete-or-error."""
    failure = classify(error, service)
    _log(failure, service, method)
    return common_pb2.Error(code=failure.code, message=failure.message)
