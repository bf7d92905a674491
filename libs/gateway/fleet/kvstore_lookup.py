"""How much of a prompt the kvstore holds, asked by the gateway before it routes.

When the kvstore holds all of a prompt but a short tail, a decode worker can load the prefix
itself (its kvstore connector) and compute the tail: the prefill hop and the NIXL handoff are
then pure overhead, so the pipeline skips them. Any failure answers 0 (route as usual).
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import structlog

from cleave.common.v1 import common_pb2
from cleave.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from libs.rpc.channel import open_channel
from libs.rpc.security import RpcSecurity

log = structlog.get_logger(__name__)


class KvStoreLookup:
    def __init__(
        self,
        address: str,
        layout: common_pb2.KvLayout,
        timeout_s: float = 0.5,
        security: RpcSecurity | None = None,
    ) -> None:
        self._channel = open_channel(address, security=security)
        self._stub = kvstore_pb2_grpc.KvStoreStub(self._channel)
        self._layout = layout
        self._timeout_s = timeout_s

    async def matched_tokens(
        self,
        request_id: str,
        token_ids: Sequence[int],
        cache_salt: str = "",
        lora: common_pb2.LoraAdapter | None = None,
    ) -> int:
        """Leading tokens the kvstore holds for this prompt under `cache_salt` and `lora`."""
        request = kvstore_pb2.LookupRequest(
            metadata=common_pb2.RequestMetadata(request_id=request_id, cache_salt=cache_salt, lora=lora),
            token_ids=token_ids,
            layout=self._layout,
        )
        try:
            response = await self._stub.Lookup(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as error:
            log.warning("kvstore lookup failed; routing through prefill", code=error.code().name)
            return 0
        return int(response.matched_tokens)

    async def close(self) -> None:
        await self._channel.close()
