"""A worker's gRPC failure or Error message as the client's OpenAI error (fault attribution:
INVALID_ARGUMENT is the client's 400, NOT_FOUND its 404 (a LoRA adapter no worker finds at its
path: vLLM's LoRAAdapterNotFoundError), RESOURCE_EXHAUSTED a 429, UNAVAILABLE a 503)."""

from __future__ import annotations

import grpc
import grpc.aio
import structlog

from cleave.common.v1 import common_pb2
from libs.gateway.common import errors

log = structlog.get_logger(__name__)


def api_error(error: grpc.aio.AioRpcError) -> errors.ApiError:
    details = error.details() or error.code().name
    if error.code() == grpc.StatusCode.INVALID_ARGUMENT:
        return errors.invalid(details)
    if error.code() == grpc.StatusCode.NOT_FOUND:
        return errors.ApiError(404, details, type_="NotFoundError", code=404)
    if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return errors.overloaded()
    if error.code() == grpc.StatusCode.UNAVAILABLE:
        # gRPC's transport details name the worker's internal address (a container's or pod's
        # IP): logged for the operator, never sent to the client.
        log.warning("worker unavailable", details=details)
        return errors.ApiError(
            503, "worker unavailable: its connection failed; retry later", type_="service_unavailable"
        )
    return errors.ApiError(500, f"worker error: {details}", type_="server_error")


def worker_error(error: common_pb2.Error) -> errors.ApiError:
    if error.code == common_pb2.ERROR_CODE_INVALID_ARGUMENT:
        return errors.invalid(error.message)
    return errors.ApiError(500, f"worker error: {error.message}", type_="server_error")
