"""A worker's gRPC status as the client's OpenAI error (fault attribution)."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest

from libs.gateway.serving.worker_errors import api_error


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, 400),
        (grpc.StatusCode.NOT_FOUND, 404),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
        (grpc.StatusCode.UNAVAILABLE, 503),
        (grpc.StatusCode.INTERNAL, 500),
    ],
)
def test_each_status_is_the_clients_error_it_stands_for(code: grpc.StatusCode, status: int) -> None:
    assert api_error(rpc_error(code, "Loading lora sql failed: No adapter found for /a")).status == status


def test_an_adapter_no_worker_finds_is_vllms_404_with_its_message() -> None:
    error = api_error(
        rpc_error(grpc.StatusCode.NOT_FOUND, "Loading lora sql failed: No adapter found for /a")
    )
    assert error.body()["error"] == {
        "message": "Loading lora sql failed: No adapter found for /a",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }
