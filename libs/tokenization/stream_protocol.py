"""What the tokenizer service's streaming calls share: the first message must be the stream's
`start`, and a request id in it is bound to the stream's log lines."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from cleave.common.v1 import common_pb2
from libs.observability.logging import bind_request_id
from libs.rpc.errors import InvalidRequest


async def first_start(requests: AsyncIterator[Any]) -> Any:
    """The stream's first message, which must set its `kind` oneof to `start`; raises
    InvalidRequest otherwise (the stream then ends before any response)."""
    first = await anext(requests, None)
    if first is None or first.WhichOneof("kind") != "start":
        got = "nothing" if first is None else f"`{first.WhichOneof('kind')}`"
        raise InvalidRequest(f"the first message must be `start`, got {got}")
    return first


def bind_request(metadata: common_pb2.RequestMetadata) -> None:
    # The service's interceptor already bound x-request-id (or a fresh id); an id in the
    # message is the caller's explicit one. Each call runs in its own task: it cannot leak.
    if metadata.request_id:
        bind_request_id(metadata.request_id)
