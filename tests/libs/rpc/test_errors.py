"""The one error mapping of every servicer, over a real loopback server: each Cleave error
class ends a call with its status and message; anything else is INTERNAL with a message that
reveals nothing."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.rpc import errors
from libs.rpc.channel import open_channel
from libs.rpc.server import GrpcServer, ServerConfig, ServiceBinding

pytestmark = pytest.mark.anyio


class Raising(worker_pb2_grpc.WorkerServicer):
    """GetInfo raises whatever `error` holds, through errors.abort."""

    def __init__(self) -> None:
        self.error: Exception = RuntimeError("unset")

    async def GetInfo(
        self, request: worker_pb2.GetInfoRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.WorkerInfo:
        try:
            raise self.error
        except Exception as error:
            await errors.abort(context, error, service="test", method="GetInfo")


@pytest.mark.parametrize(
    ("error", "status", "message"),
    [
        (errors.InvalidRequest("logit_bias key 99999 is not a token id"), grpc.StatusCode.INVALID_ARGUMENT,
         "logit_bias key 99999 is not a token id"),
        (errors.FailedPrecondition("wrong role"), grpc.StatusCode.FAILED_PRECONDITION, "wrong role"),
        (errors.Unavailable("engine dead"), grpc.StatusCode.UNAVAILABLE, "engine dead"),
        (errors.Aborted("lease expired"), grpc.StatusCode.ABORTED, "lease expired"),
        (RuntimeError("secret redis://user:pw@host"), grpc.StatusCode.INTERNAL, "internal error in the test service"),
        (ValueError("a bug, not the client's mistake"), grpc.StatusCode.INTERNAL, "internal error in the test service"),
    ],
)  # fmt: skip
async def test_each_error_class_ends_the_call_with_its_status(
    error: Exception, status: grpc.StatusCode, message: str
) -> None:
    servicer = Raising()
    servicer.error = error
    server = GrpcServer(
        ServerConfig(),
        [ServiceBinding("cleave.worker.v1.Worker", servicer, worker_pb2_grpc.add_WorkerServicer_to_server)],
    )
    await server.start()
    try:
        async with open_channel(server.address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await worker_pb2_grpc.WorkerStub(channel).GetInfo(worker_pb2.GetInfoRequest())
    finally:
        await server.stop()
    assert raised.value.code() == status
    assert raised.value.details() == message


def test_stream_error_carries_the_code_of_the_class() -> None:
    invalid = errors.stream_error(errors.InvalidRequest("bad stop"), service="s", method="m")
    assert (invalid.code, invalid.message) == (common_pb2.ERROR_CODE_INVALID_ARGUMENT, "bad stop")
    crash = errors.stream_error(KeyError("internal detail"), service="s", method="m")
    assert (crash.code, crash.message) == (common_pb2.ERROR_CODE_INTERNAL, "internal error in the s service")


def test_invalid_request_is_a_value_error_for_library_code() -> None:
    # Library code that already catches ValueError for bad input keeps working.
    assert issubclass(errors.InvalidRequest, ValueError)
    assert not issubclass(errors.Unavailable, ValueError)
