"""Errors the worker reports to its callers; the servicer maps them to gRPC status codes."""


class InvalidRequest(ValueError):
    """The request can never succeed as sent (gRPC INVALID_ARGUMENT)."""


class EngineUnavailable(RuntimeError):
    """The engine is not running (starting, stopped or dead): gRPC UNAVAILABLE, retryable."""


class KvTransferFailed(RuntimeError):
    """The handed-over KV could not be loaded (gRPC ABORTED): the caller may retry prefill."""
