"""The LoRA adapters this gateway serves, as vLLM's server does: `--lora-modules` at start,
`/v1/load_lora_adapter` and `/v1/unload_lora_adapter` at run time (only with vLLM's
VLLM_ALLOW_RUNTIME_LORA_UPDATING), a request's `model` resolved to the base model or an
adapter, and /v1/models' cards for them.

Workers keep no list of adapters: every request carries its adapter's name and path
(RequestMetadata.lora) and a worker loads it on first use. So an adapter loaded here reaches
every worker, including those that join or restart later. A run-time load is first tried on
every worker serving now (Worker.LoadLoraAdapter, vLLM's add_lora), as vLLM's server tries it
on its engine, so a bad adapter is refused with vLLM's status and message. The list itself is this gateway
process's, as vLLM's is its API server's: with several gateways (replicas, or
--api-server-count) give adapters with --lora-modules, which every one of them reads.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import grpc
import grpc.aio
from pydantic import BaseModel

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2
from libs.config.errors import ConfigError
from libs.config.flags import Codec, flag
from libs.gateway.common import errors

# vLLM's switch for the run-time endpoints (vllm.envs.VLLM_ALLOW_RUNTIME_LORA_UPDATING).
RUNTIME_UPDATES_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
# A worker reads the adapter from its file system and copies it into its engine.
LOAD_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class LoraModule:
    """One adapter: vLLM's LoRAModulePath (is_3d_lora_weight aside)."""

    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(flag: str, text: str) -> LoraModule:
    """vLLM's two spellings: `name=path`, or a JSON object with name, path and optionally
    base_model_name."""
    if "=" in text and "," not in text:
        name, path = text.split("=", 1)
        module = LoraModule(name.strip(), path.strip())
    else:
        try:
            document = json.loads(text)
            module = LoraModule(**document)
        except (ValueError, TypeError) as error:
            raise ConfigError(
                flag, text, f'name=path or a JSON object {{"name": ..., "path": ...}} ({error})'
            ) from None
    if not module.name or not module.path:
        raise ConfigError(flag, text, "an adapter name and a path")
    return module


def format_lora_module(module: LoraModule) -> str:
    if module.base_model_name is None and "," not in module.path and "=" not in module.name:
        return f"{module.name}={module.path}"
    return json.dumps(asdict(module))


LORA_MODULE: Codec[LoraModule] = Codec(parse_lora_module, format_lora_module)


def runtime_updates_allowed(environ: Mapping[str, str]) -> bool:
    """vLLM's reading of VLLM_ALLOW_RUNTIME_LORA_UPDATING: "1" or "true", any case."""
    return environ.get(RUNTIME_UPDATES_ENV, "0").strip().lower() in ("1", "true")


@dataclass(frozen=True, kw_only=True)
class LoraServingFlags:
    """The gateway's LoRA flag (the workers' --enable-lora and --max-lora* are EngineFlags)."""

    lora_modules: tuple[LoraModule, ...] = flag(
        (),
        codec=LORA_MODULE,
        many=True,
        help="LoRA adapters clients name as `model`: name=path or JSON "
        '\'{"name": ..., "path": ..., "base_model_name": ...}\', several after one flag (vLLM\'s flag; '
        "needs --enable-lora; the path is read by every worker)",
    )

    def adapters(self, environ: Mapping[str, str] = os.environ) -> Adapters:
        return Adapters(self.lora_modules, runtime_updates=runtime_updates_allowed(environ))


class LoadLoraAdapterRequest(BaseModel):
    """vLLM's body for /v1/load_lora_adapter."""

    lora_name: str
    lora_path: str
    load_inplace: bool = False
    is_3d_lora_weight: bool = False


class UnloadLoraAdapterRequest(BaseModel):
    """vLLM's body for /v1/unload_lora_adapter."""

    lora_name: str
    lora_int_id: int | None = None


class Adapters:
    def __init__(self, modules: Sequence[LoraModule] = (), *, runtime_updates: bool = False) -> None:
        self._modules = {module.name: module for module in modules}
        self.runtime_updates = runtime_updates
        self._locks: dict[str, asyncio.Lock] = {}  # one load or unload of a name at a time, as vLLM

    def resolve(self, requested: str | None, served: str) -> common_pb2.LoraAdapter | None:
        """The adapter a request's `model` names; None for the base model (or no name, as
        vLLM allows). Any other name is vLLM's 404."""
        if not requested or requested == served:
            return None
        module = self._modules.get(requested)
        if module is None:
            raise errors.model_not_found(requested, served)
        return common_pb2.LoraAdapter(name=module.name, path=module.path)

    def cards(self, served: str) -> list[dict[str, Any]]:
        """/v1/models' entries for the adapters (vLLM's: root is the path, parent the base)."""
        return [
            {
                "id": module.name,
                "object": "model",
                "created": 0,
                "owned_by": "cleave",
                "root": module.path,
                "parent": module.base_model_name or served,
                "max_model_len": None,
            }
            for module in self._modules.values()
        ]

    async def load(self, body: LoadLoraAdapterRequest, served: str, workers: Sequence[Any]) -> str:
        """/v1/load_lora_adapter: vLLM's checks and messages; the adapter is loaded on every
        worker in `workers` (the pool's endpoints) before it is served."""
        async with self._locks.setdefault(body.lora_name, asyncio.Lock()):
            self.check_load(body, served)
            await load_on_workers(workers, common_pb2.LoraAdapter(name=body.lora_name, path=body.lora_path))
            self._modules[body.lora_name] = LoraModule(body.lora_name, body.lora_path)
        return f"Success: LoRA adapter '{body.lora_name}' added successfully."

    def check_load(self, body: LoadLoraAdapterRequest, served: str) -> None:
        """vLLM's checks of a load request, before any engine is asked."""
        name, path = body.lora_name, body.lora_path
        if not name or not path:
            raise errors.ApiError(
                400, "Both 'lora_name' and 'lora_path' must be provided.", type_="InvalidUserInput", code=400
            )
        if name == served:
            raise errors.ApiError(
                400,
                f"The lora adapter '{name}' conflicts with a served base model.",
                type_="InvalidUserInput",
                code=400,
            )
        if name in self._modules and not body.load_inplace:
            raise errors.ApiError(
                400,
                f"The lora adapter '{name}' has already been loaded. If you want to load the adapter "
                "in place, set 'load_inplace' to True.",
                type_="InvalidUserInput",
                code=400,
            )

    def unload(self, body: UnloadLoraAdapterRequest) -> str:
        name = body.lora_name
        if not name:
            raise errors.ApiError(
                400,
                "'lora_name' needs to be provided to unload a LoRA adapter.",
                type_="InvalidUserInput",
                code=400,
            )
        if name not in self._modules:
            raise errors.ApiError(
                404, f"The lora adapter '{name}' cannot be found.", type_="NotFoundError", code=404
            )
        del self._modules[name]
        return f"Success: LoRA adapter '{name}' removed successfully."


async def load_on_workers(workers: Sequence[Any], adapter: common_pb2.LoraAdapter) -> None:
    """Loads the adapter on every healthy worker at once; the first refusal is the answer, in
    vLLM's terms: no adapter at the path is its 404, an adapter the engine refuses its 500."""
    healthy = [w for w in workers if w.healthy]
    if not healthy:
        raise errors.ApiError(503, "no worker is serving to load the adapter on", type_="service_unavailable")
    request = worker_pb2.LoadLoraAdapterRequest(adapter=adapter)
    calls = (w.stub.LoadLoraAdapter(request, timeout=LOAD_TIMEOUT_S) for w in healthy)
    for outcome in await asyncio.gather(*calls, return_exceptions=True):
        if isinstance(outcome, grpc.aio.AioRpcError):
            raise _load_refused(outcome) from outcome
        if isinstance(outcome, BaseException):
            raise outcome


def _load_refused(error: grpc.aio.AioRpcError) -> errors.ApiError:
    details = error.details() or error.code().name
    if error.code() is grpc.StatusCode.NOT_FOUND:
        return errors.ApiError(404, details, type_="NotFoundError", code=404)
    if error.code() is grpc.StatusCode.INVALID_ARGUMENT:
        return errors.ApiError(500, details, type_="InternalServerError", code=500)
    return errors.ApiError(
        503, f"a worker could not load the adapter: {details}", type_="service_unavailable"
    )
