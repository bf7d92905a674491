"""The LoRA adapters requests name, as vLLM's LoRARequests: each gets this engine's integer id
and is loaded into the engine once before its first request runs.

vLLM's own server loads an adapter with `add_lora` when it is registered (--lora-modules,
/v1/load_lora_adapter) and so refuses a bad path before any request uses it. Here requests
carry the adapter (name and path) and a worker meets it on first use: loading it then, through
the same `add_lora`, keeps a bad path the client's error (vLLM's engine would otherwise fail
in the middle of a step). Ids are this engine's own: vLLM hashes blocks by name and path, so
workers need not agree on them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from vllm.exceptions import LoRAAdapterNotFoundError
from vllm.lora.request import LoRARequest

from libs.rpc.errors import NotFound
from libs.worker.engine import Adapter
from libs.worker.errors import InvalidRequest


class LoraAdapters:
    def __init__(self, add_lora: Callable[[LoRARequest], Awaitable[bool]]) -> None:
        self._add_lora = add_lora
        self._loaded: dict[Adapter, LoRARequest] = {}
        self._locks: dict[Adapter, asyncio.Lock] = {}
        self._next_id = 1

    async def request_for(self, adapter: Adapter | None) -> LoRARequest | None:
        if adapter is None:
            return None
        loaded = self._loaded.get(adapter)
        if loaded is not None:
            return loaded
        async with self._locks.setdefault(adapter, asyncio.Lock()):
            if adapter in self._loaded:  # a request that waited on the lock
                return self._loaded[adapter]
            # Taken before the load is awaited, and never reused: vLLM's add_lora takes an id it
            # already holds as loaded, so two adapters loading at once must not share one.
            request = LoRARequest(lora_name=adapter.name, lora_int_id=self._next_id, lora_path=adapter.path)
            self._next_id += 1
            try:
                await self._add_lora(request)
            except Exception as error:  # vLLM's message, as its server tells missing from refused
                not_found = str(LoRAAdapterNotFoundError(adapter.name, adapter.path))
                if not_found in str(error):
                    raise NotFound(not_found) from error
                raise InvalidRequest(str(error)) from error
            self._loaded[adapter] = request
            return request
