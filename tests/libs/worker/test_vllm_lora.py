"""The worker's LoRA adapters as vLLM LoRARequests: loaded once each (concurrent first uses
included), with this engine's ids, and a load failure the client's error, not the worker's."""

from __future__ import annotations

import asyncio

import pytest
from vllm.exceptions import LoRAAdapterNotFoundError
from vllm.lora.request import LoRARequest

from libs.rpc.errors import NotFound
from libs.worker.engine import Adapter
from libs.worker.errors import InvalidRequest
from libs.worker.vllm_lora import LoraAdapters

pytestmark = pytest.mark.anyio


class Engine:
    def __init__(self, missing: frozenset[str] = frozenset()) -> None:
        self.missing = missing
        self.loaded: list[LoRARequest] = []

    async def add_lora(self, request: LoRARequest) -> bool:
        await asyncio.sleep(0.01)  # a load takes a while: concurrent first uses overlap
        if request.lora_path in self.missing:  # as vLLM's engine-core client re-raises it
            raise RuntimeError(
                f"Call to add_lora method failed: {LoRAAdapterNotFoundError(request.lora_name, request.lora_path)}"
            )
        if request.lora_path == "/rank-1024":
            raise RuntimeError(
                "Call to add_lora method failed: LoRA rank 1024 is greater than max_lora_rank 8."
            )
        self.loaded.append(request)
        return True


async def test_each_adapter_is_loaded_once_with_its_own_id() -> None:
    engine = Engine()
    adapters = LoraAdapters(engine.add_lora)
    sql, chat = Adapter("sql", "/a/sql"), Adapter("chat", "/a/chat")
    first = await asyncio.gather(*(adapters.request_for(sql) for _ in range(5)))
    assert len({id(r) for r in first}) == 1 and len(engine.loaded) == 1
    other = await adapters.request_for(chat)
    assert other is not None and first[0] is not None
    assert (first[0].lora_name, first[0].lora_int_id, first[0].lora_path) == ("sql", 1, "/a/sql")
    assert (other.lora_name, other.lora_int_id) == ("chat", 2)
    # The same name at another path is another adapter (vLLM hashes blocks by both).
    moved = await adapters.request_for(Adapter("sql", "/a/sql-v2"))
    assert moved is not None and moved.lora_int_id == 3
    assert await adapters.request_for(None) is None


async def test_adapters_loading_at_once_get_ids_of_their_own() -> None:
    engine = Engine()
    adapters = LoraAdapters(engine.add_lora)
    loaded = await asyncio.gather(*(adapters.request_for(Adapter(f"a{i}", f"/a/{i}")) for i in range(4)))
    assert sorted(r.lora_int_id for r in loaded if r is not None) == [1, 2, 3, 4]
    assert len({r.lora_int_id for r in engine.loaded}) == 4


async def test_an_adapter_that_cannot_be_loaded_is_the_clients_error_and_is_tried_again() -> None:
    engine = Engine(missing=frozenset({"/nowhere"}))
    adapters = LoraAdapters(engine.add_lora)
    with pytest.raises(NotFound, match="Loading lora ghost failed: No adapter found for /nowhere"):
        await adapters.request_for(Adapter("ghost", "/nowhere"))
    with pytest.raises(InvalidRequest, match="is greater than max_lora_rank"):
        await adapters.request_for(Adapter("big", "/rank-1024"))
    engine.missing = frozenset()
    loaded = await adapters.request_for(Adapter("ghost", "/nowhere"))
    assert loaded is not None and loaded.lora_int_id == 3  # an id a failed load took is not reused
