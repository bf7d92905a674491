"""Errors the worker reports to its callers, mapped to gRPC status codes by libs.rpc.errors."""

from __future__ import annotations

from cleave.common.v1 import common_pb2
from libs.rpc.errors import Aborted, InvalidRequest, Unavailable

__all__ = ["EngineUnavailable", "InvalidRequest", "KvTransferFailed"]


class EngineUnavailable(Unavailable):
    """The engine is not running (starting, stopped or dead): gRPC UNAVAILABLE, retryable."""


class KvTransferFailed(Aborted):
    """The handed-over KV could not be loaded (gRPC ABORTED): the caller may retry prefill."""

    code = common_pb2.ERROR_CODE_KV_TRANSFER_FAILED
