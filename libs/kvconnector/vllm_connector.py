"""A vLLM KV connector that loads prompt prefixes from Cleave's kvstore and saves new ones.

The gap this fills: LMCache's own vLLM connector does not run on vLLM's CPU build (its
connector factory knows only GPU-like devices and falls back to recomputing), and vLLM's
offloading connectors keep KV inside one engine.
This connector makes the kvstore (LMCache's tiers behind a gRPC service) a fleet-wide prefix
cache for every worker: the scheduler half asks the kvstore how much of a prompt it holds
(one Lookup per request) and tells vLLM those tokens are external hits; the worker half
fetches those chunks and writes them into the request's blocks before the forward pass, and
after it copies newly computed full chunks out and hands them to a background sender.

It coexists with the NIXL handoff through vLLM's MultiConnector (engine_args.py): NIXL
claims requests that carry a remote prefill, this connector all the others. Any kvstore
failure means "compute it here" plus a warning and a counter, never a failed request or a
dead engine: any exception in a Lookup reports no hit (and pauses lookups briefly), any
exception while loading (the kvstore, a bad chunk, a tensor that does not fit) reports the
blocks not yet written to vLLM, which recomputes them (kv_load_failure_policy "recompute",
get_block_ids_with_load_errors). Every call the engine waits on has a deadline
(`kvstore_timeout_s`, the worker's --kvstore-timeout-s).

Loaded via vLLM's `kv_connector_module_path`; settings come from kv_connector_extra_config
(keys in ConnectorSettings).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.model_executor.models.utils import extract_layer_index

from cleave.common.v1 import common_pb2
from libs.config.flags import parse
from libs.config.groups import GrpcSecurityFlags
from libs.kvconnector import paged
from libs.kvconnector.client import KvStoreClient, KvStoreUnavailable
from libs.kvconnector.counters import CounterBox, KvStoreConnectorStats, KvStorePromMetrics
from libs.kvconnector.plan import (
    LoadSpec,
    RequestState,
    SaveSpec,
    load_spec,
    save_specs,
    stored_leading_chunks,
    tokens_to_load,
)
from libs.kvconnector.saver import BackgroundSaver
from libs.kvlayout.from_vllm import engine_kv_facts
from libs.kvlayout.layout import kv_layout
from libs.kvstore.chunks import tensor_crc32c
from libs.rpc.security import RpcSecurity, load_security

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

log = logging.getLogger(__name__)

CONNECTOR_NAME = "KvStoreConnector"  # MultiConnector files stats under the class name


@dataclass(frozen=True)
class ConnectorSettings:
    address: str
    chunk_tokens: int
    save: bool  # prefill and colocated workers save; decode workers only load
    encode_mxint8: bool
    timeout_s: float = 2.0
    # After a failed Lookup, requests skip the kvstore for this long instead of each waiting
    # for the same failure inside vLLM's scheduler loop.
    retry_after_s: float = 5.0
    # The worker's --grpc-* flags (file paths only) for the channel to the kvstore.
    grpc_flags: tuple[str, ...] = ()

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any]) -> ConnectorSettings:
        return cls(
            address=str(extra["kvstore_address"]),
            chunk_tokens=int(extra["kvstore_chunk_tokens"]),
            save=bool(extra["kvstore_save"]),
            encode_mxint8=bool(extra.get("kvstore_mxint8", False)),
            timeout_s=float(extra.get("kvstore_timeout_s", 2.0)),
            retry_after_s=float(extra.get("kvstore_retry_after_s", 5.0)),
            grpc_flags=tuple(str(f) for f in extra.get("kvstore_grpc_flags", ())),
        )

    def security(self, environ: Mapping[str, str]) -> RpcSecurity:
        """The channel's TLS material and token, read here in the engine's process (vLLM's
        config carries only paths; the token may come from the inherited environment)."""
        return load_security(parse(GrpcSecurityFlags, list(self.grpc_flags)), environ)


@dataclass
class KvStoreConnectorMetadata(KVConnectorMetadata):
    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)


def stored_dtype(vllm_config: Any) -> torch.dtype:
    """The KV cache's torch dtype, which chunks are stored in; refuses what the kvstore cannot
    hold. The layout chunks are keyed by comes from libs/kvlayout, as the worker's does."""
    cache_dtype = str(vllm_config.cache_config.cache_dtype)
    if cache_dtype != "auto":
        raise ValueError(
            f"the kvstore connector stores KV in the model's dtype; kv-cache-dtype {cache_dtype!r} is not supported"
        )
    dtype: torch.dtype = vllm_config.model_config.dtype
    if dtype not in paged.TORCH_TO_PROTO:
        raise ValueError(f"the kvstore connector does not store KV of dtype {dtype}")
    return dtype


class KvStoreConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        transfer = vllm_config.kv_transfer_config
        self._settings = ConnectorSettings.from_extra_config(transfer.kv_connector_extra_config)
        self._block_size = int(vllm_config.cache_config.block_size)
        if self._settings.chunk_tokens % self._block_size:
            raise ValueError(
                f"kvstore chunk of {self._settings.chunk_tokens} tokens is not a multiple of the "
                f"KV block size {self._block_size}"
            )
        self._dtype = stored_dtype(vllm_config)
        self._layout = kv_layout(engine_kv_facts(vllm_config))
        self._counters = CounterBox()
        self._client: KvStoreClient | None = None
        # Scheduler half
        self._requests: dict[str, RequestState] = {}
        self._skip_lookups_until = 0.0
        # Worker half
        self._layers: list[torch.Tensor] = []
        self._failed_blocks: set[int] = set()
        self._saver: BackgroundSaver | None = None

    def _kvstore(self) -> KvStoreClient:
        # Created on first use, in the process and thread that uses it (vLLM may fork).
        if self._client is None:
            self._client = self._new_client()
        return self._client

    def _new_client(self) -> KvStoreClient:
        return KvStoreClient(
            self._settings.address,
            self._layout,
            self._settings.timeout_s,
            security=self._settings.security(os.environ),
        )

    # ---- scheduler half ------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        params = request.kv_transfer_params or {}
        if params.get("do_remote_prefill"):
            return 0, False  # the NIXL handoff brings this prompt's KV
        state = self._state(request)
        if state.lookup is None:
            return 0, False
        count = tokens_to_load(
            state.lookup.matched_tokens, state.prompt_len, num_computed_tokens, self._block_size
        )
        state.pending_load = (num_computed_tokens, num_computed_tokens + count) if count else None
        return count, False

    def _state(self, request: Request) -> RequestState:
        state = self._requests.get(request.request_id)
        if state is not None:
            return state
        tokens = list(request.prompt_token_ids or ())
        lookup = None
        now = time.monotonic()
        if now >= self._skip_lookups_until:
            try:
                # vLLM keys its own prefix cache by request.cache_salt and the LoRA adapter's
                # name and path; the kvstore too.
                lookup = self._kvstore().lookup(
                    request.request_id, tokens, request.cache_salt or "", _adapter(request.lora_request)
                )
            except Exception as error:  # anything: the engine's scheduler must go on
                self._skip_lookups_until = now + self._settings.retry_after_s
                self._counters.add(lookup_failures=1)
                log.warning(
                    "kvstore lookup failed; computing prompts here for %.0f s: %s",
                    self._settings.retry_after_s,
                    _describe(error),
                )
            self._counters.add(lookups=1, lookup_seconds=time.monotonic() - now)
        done = stored_leading_chunks(lookup.matched_tokens, self._settings.chunk_tokens) if lookup else 0
        state = RequestState(request.request_id, len(tokens), lookup, chunks_done=done)
        self._requests[request.request_id] = state
        return state

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        state = self._requests.get(request.request_id)
        if state is not None and num_external_tokens == 0:
            state.pending_load = None

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = KvStoreConnectorMetadata()
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            state = self._requests.get(new.req_id)
            if state is not None:
                state.block_ids = list(new.block_ids[0])
                self._plan(meta, state, new.num_computed_tokens + scheduled[new.req_id])
        cached = scheduler_output.scheduled_cached_reqs
        for index, req_id in enumerate(cached.req_ids):
            state = self._requests.get(req_id)
            if state is None:
                continue
            new_ids = cached.new_block_ids[index]
            if new_ids is not None:
                if req_id in cached.resumed_req_ids:
                    state.block_ids = list(new_ids[0])  # a resumed request gets all its blocks anew
                else:
                    state.block_ids.extend(new_ids[0])
            self._plan(meta, state, cached.num_computed_tokens[index] + scheduled[req_id])
        return meta

    def _plan(self, meta: KvStoreConnectorMetadata, state: RequestState, computed_end: int) -> None:
        if state.pending_load is not None:
            meta.loads.append(load_spec(state, self._settings.chunk_tokens))
            state.pending_load = None
        if self._settings.save:
            meta.saves.extend(save_specs(state, self._settings.chunk_tokens, computed_end))

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._requests.pop(request.request_id, None)
        return False, None

    # ---- worker half ---------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        ordered = sorted(kv_caches.items(), key=lambda item: extract_layer_index(item[0]))
        for name, layer in ordered:
            paged.check_layer_shape(
                name, layer, self._block_size, self._layout.num_kv_heads, self._layout.head_dim
            )
        self._layers = [layer for _, layer in ordered]
        if self._settings.save:
            self._saver = BackgroundSaver(
                self._new_client, self._counters, encode_mxint8=self._settings.encode_mxint8
            )

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvStoreConnectorMetadata)
        for spec in meta.loads:
            self._load(spec)

    def _load(self, spec: LoadSpec) -> None:
        started = time.monotonic()
        loaded_to = spec.start
        loaded_bytes = 0
        try:
            for index, chunk in enumerate(self._kvstore().get(spec.request_id, spec.keys)):
                expected = spec.keys[index]
                if chunk.key.prefix_hash != expected.prefix_hash or tensor_crc32c(chunk.kv) != chunk.crc32c:
                    log.warning("kvstore sent a chunk that fails its key or checksum; recomputing from there")
                    break
                chunk_start = spec.first_token + index * self._settings.chunk_tokens
                lo, hi = max(spec.start, chunk_start), min(spec.end, chunk_start + chunk.key.num_tokens)
                dense = paged.from_proto(chunk.kv, self._dtype)
                paged.scatter(
                    dense[:, :, lo - chunk_start : hi - chunk_start],
                    self._layers,
                    spec.block_ids,
                    self._block_size,
                    lo,
                )
                loaded_to = hi
                loaded_bytes += len(chunk.kv.data) + len(chunk.kv.mx_scales)
                if loaded_to >= spec.end:
                    break
        except Exception as error:  # anything: what was not written is recomputed, the engine lives
            log.warning("kvstore load failed; recomputing the rest of the prefix: %s", _describe(error))
        if loaded_to < spec.end:
            first, last = loaded_to // self._block_size, (spec.end - 1) // self._block_size
            self._failed_blocks.update(spec.block_ids[first : last + 1])
            self._counters.add(load_failures=1)
        self._counters.add(
            tokens_loaded=loaded_to - spec.start,
            bytes_loaded=loaded_bytes,
            load_seconds=time.monotonic() - started,
        )

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # start_load_kv loads every layer before the forward pass starts

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return  # whole chunks are copied once in wait_for_save

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvStoreConnectorMetadata)
        if not meta.saves or self._saver is None:
            return
        started = time.monotonic()
        try:
            items = [
                (
                    spec.request_id,
                    spec.key,
                    paged.gather(
                        self._layers,
                        spec.block_ids,
                        self._block_size,
                        spec.start,
                        spec.start + spec.key.num_tokens,
                    ),
                )
                for spec in meta.saves
            ]
        except Exception as error:  # a chunk not saved is a later miss; the step goes on
            self._counters.add(save_failures=len(meta.saves))
            log.warning("KV chunks not copied out for the kvstore: %s", _describe(error))
            return
        self._counters.add(save_copy_seconds=time.monotonic() - started)
        self._saver.submit(items)

    def get_block_ids_with_load_errors(self) -> set[int]:
        failed, self._failed_blocks = self._failed_blocks, set()
        return failed

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        return self._counters.take()

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        stats = KvStoreConnectorStats()
        if data:
            stats.aggregate(KvStoreConnectorStats(data=dict(data)))
        return stats

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: Any,
        metric_types: dict[type[Any], type[Any]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KvStorePromMetrics:
        return KvStorePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self) -> None:
        if self._saver is not None:
            self._saver.flush(timeout_s=10)
            self._saver.close()
        if self._client is not None:
            self._client.close()


def _adapter(lora_request: Any) -> common_pb2.LoraAdapter | None:
    if lora_request is None:
        return None
    return common_pb2.LoraAdapter(name=lora_request.lora_name, path=lora_request.lora_path)


def _describe(error: Exception) -> str:
    if isinstance(error, KvStoreUnavailable):
        return str(error)  # already names the call and the gRPC status
    return f"{type(error).__name__}: {error}"


def register() -> None:
    """Lets vLLM rebuild this connector's stats by class name (MultiConnector does, in the
    process that logs stats); idempotent."""
    if CONNECTOR_NAME not in KVConnectorFactory._registry:
        KVConnectorFactory.register_connector(CONNECTOR_NAME, __name__, "KvStoreConnector")


register()
