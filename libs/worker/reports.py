"""What a worker reports about itself: GetStats (load, KV, cumulative counters, for routing and
the gateway's metrics), GetInfo (what it serves, and how), from its engine and config, and
WatchKvCache's messages."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import asdict
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2
from libs.config.roles import Role
from libs.kvevents.cached_blocks import KvCacheUpdate
from libs.kvevents.hashing import BlockHasher
from libs.worker.config import WorkerConfig
from libs.worker.engine import EngineInfo, EngineStats
from libs.worker.speculative import spec_decode_stats

ROLES = {
    Role.PREFILL: worker_pb2.ROLE_PREFILL,
    Role.DECODE: worker_pb2.ROLE_DECODE,
    Role.BOTH: worker_pb2.ROLE_BOTH,
}
_KVSTORE_FIELDS = {f.name: f.type for f in worker_pb2.KvStoreConnectorStats.DESCRIPTOR.fields}


def worker_stats(
    role: Role,
    engine: EngineStats,
    info: EngineInfo,
    *,
    num_leased: int,
    requests_aborted: int,
    num_inflight: int,
) -> worker_pb2.WorkerStats:
    return worker_pb2.WorkerStats(
        role=ROLES[role],
        num_inflight=num_inflight,
        num_running=engine.num_running,
        num_waiting=engine.num_waiting,
        kv_cache_usage=engine.kv_cache_usage,
        kv_blocks_total=info.num_kv_blocks,
        num_leased=num_leased,
        prompt_tokens_external=engine.prompt_tokens_external,
        prompt_tokens_computed=engine.prompt_tokens_computed,
        prompt_tokens_local_cache_hit=engine.prompt_tokens_local_cache_hit,
        requests_finished=engine.requests_finished,
        requests_aborted=requests_aborted,
        spec_decode=spec_decode_stats(engine.spec_decode),
        kvstore=_kvstore_stats(engine.kvstore),
        kv_pulls=worker_pb2.KvPullStats(
            transfers=int(engine.kv_pulls.get("transfers", 0)),
            seconds=float(engine.kv_pulls.get("seconds", 0.0)),
            bytes=int(engine.kv_pulls.get("bytes", 0)),
            failures=int(engine.kv_pulls.get("failures", 0)),
        ),
    )


def worker_info(
    config: WorkerConfig,
    info: EngineInfo,
    layout: common_pb2.KvLayout,
    kv_block_hashing: BlockHasher | None = None,
    *,
    max_inflight_requests: int,
) -> worker_pb2.WorkerInfo:
    return worker_pb2.WorkerInfo(
        role=ROLES[config.role],
        model=info.model,
        max_model_len=info.max_model_len,
        vocab_size=info.vocab_size,
        kv_layout=layout,
        engine_version=info.engine_version,
        device=config.device.value,
        device_group=config.device_group,
        default_max_tokens=_default_max_tokens(info.sampling_defaults),
        max_logprobs=config.max_logprobs,
        takes_images=info.takes_images,
        generate_many=True,
        max_inflight_requests=max_inflight_requests,
        kv_cache_events=(
            worker_pb2.KvBlockHashing(
                block_size=kv_block_hashing.block_size,
                hash_algo=kv_block_hashing.algo,
                none_hash_seed=kv_block_hashing.none_hash_seed,
            )
            if kv_block_hashing is not None
            else None
        ),
        # The scheduler's own limits, by name (a 0 leaves the field unset): the config's
        # --max-num-seqs where the engine does not say.
        **({"max_num_seqs": config.max_num_seqs} | _nonzero(asdict(info.scheduler))),
    )


async def kv_cache_events(
    batches: AsyncIterator[tuple[KvCacheUpdate, ...]],
) -> AsyncGenerator[worker_pb2.KvCacheEvents, None]:
    async for updates in batches:
        yield worker_pb2.KvCacheEvents(
            updates=[
                worker_pb2.KvCacheUpdate(cleared=u.cleared, removed=u.removed, stored=u.stored)
                for u in updates
            ]
        )


def _nonzero(limits: Mapping[str, int]) -> dict[str, int]:
    return {name: value for name, value in limits.items() if value}


def _kvstore_stats(counters: dict[str, float]) -> worker_pb2.KvStoreConnectorStats:
    stats = worker_pb2.KvStoreConnectorStats()
    for name, value in counters.items():
        kind = _KVSTORE_FIELDS.get(name)
        if kind is not None:
            setattr(stats, name, value if kind == FieldDescriptor.TYPE_DOUBLE else int(value))
    return stats


def _default_max_tokens(defaults: Mapping[str, Any]) -> int | None:
    """vLLM names generation_config.json's max_new_tokens `max_tokens` in its defaults."""
    value = defaults.get("max_tokens")
    return int(value) if value is not None else None
