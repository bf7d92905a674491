"""The request-side checks the HTTP routes run before generating."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest

from libs.gateway.api.requests import tokenizer_call, validation_error
from libs.gateway.common import errors

pytestmark = pytest.mark.anyio


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


async def failing(error: Exception) -> list[int]:
    raise error


async def test_tokenizer_call_passes_the_result_through() -> None:
    async def ids() -> list[int]:
        return [1, 2]

    assert await tokenizer_call(ids()) == [1, 2]


async def test_input_the_tokenizer_refuses_is_the_clients_error() -> None:
    with pytest.raises(errors.ApiError, match="bad template") as raised:
        await tokenizer_call(failing(rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "bad template")))
    assert raised.value.status == 400


async def test_a_tokenizer_that_is_down_is_a_503() -> None:
    with pytest.raises(errors.ApiError, match="tokenizer unavailable: UNAVAILABLE") as raised:
        await tokenizer_call(failing(rpc_error(grpc.StatusCode.UNAVAILABLE, "connection refused")))
    assert (raised.value.status, raised.value.type) == (503, "service_unavailable")


def test_a_body_that_fails_validation_gets_vllms_400() -> None:
    # The format itself is pinned to vLLM's handler in test_validation_errors.
    error = validation_error([{"type": "missing", "loc": ("body", "messages"), "msg": "Field required"}])
    assert (error.status, error.param) == (400, "body.messages")
    assert (
        error.message
        == "1 validation error:\n  {'type': 'missing', 'loc': 'body.messages', 'msg': 'Field required'}"
    )
