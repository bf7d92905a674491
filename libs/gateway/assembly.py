"""The gateway's parts, wired from service addresses: worker pool (with its health poller and
Prometheus collector), tokenizer client, kvstore lookup, routing policies and pipeline."""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import cast

import prometheus_client
import structlog

from cleave.tokenizer.v1 import tokenizer_pb2_grpc
from cleave.worker.v1 import worker_pb2
from libs.gateway.admission import Admission, AdmissionConfig
from libs.gateway.breaker import BreakerConfig
from libs.gateway.deadline import DeadlineStub
from libs.gateway.disaggregation import DisaggConfig
from libs.gateway.discovery import WorkerDiscovery
from libs.gateway.kvstore_lookup import KvStoreLookup
from libs.gateway.local_detokenize import load_decoder
from libs.gateway.migration import DEFAULT_LIMIT as DEFAULT_MIGRATION_LIMIT
from libs.gateway.pipeline import Pipeline
from libs.gateway.pool import Endpoint, WorkerPool
from libs.gateway.routing import create_policy
from libs.gateway.worker_metrics import WorkerStatsCollector
from libs.rpc.channel import open_channel
from libs.rpc.security import RpcSecurity

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class GatewayParts:
    served_model: str
    max_model_len: int
    pipeline: Pipeline
    pool: WorkerPool
    tokenizer: tokenizer_pb2_grpc.TokenizerStub
    # max_tokens for requests that set none: the model's generation_config.json under
    # `--generation-config auto`; None = the rest of the context.
    default_max_tokens: int | None = None
    # The workers' --max-logprobs as reported (-1 = the vocabulary; None = vLLM's default).
    max_logprobs: int | None = None
    vocab_size: int | None = None
    # The workers' model is a vision-language model (WorkerInfo.takes_images): without an
    # encoder service they encode a prompt's images themselves.
    takes_images: bool = False


async def assemble(
    cleanup: AsyncExitStack,
    *,
    tokenizer_address: str,
    workers: dict[str, list[str]],
    routing: str,
    kvstore_address: str | None,
    served_model: str = "",
    migration_limit: int = DEFAULT_MIGRATION_LIMIT,
    security: RpcSecurity | None = None,
    breaker: BreakerConfig | None = None,
    admission: AdmissionConfig | None = None,
    request_timeout_s: float | None = 600.0,
    worker_dns_refresh_s: float = 0.0,
    wait_for_workers_s: float = 0.0,
    disagg: DisaggConfig | None = None,
    shared_streams: bool = True,
) -> GatewayParts:
    """Connects to the services; everything opened is closed by `cleanup`. With
    `worker_dns_refresh_s` > 0 a worker host name stands for all its DNS addresses, looked up
    again that often (discovery.py); with 0 gRPC is given the addresses as they are.
    `wait_for_workers_s`: how long to wait for a first worker to answer (workers started
    beside the gateway, in compose or Kubernetes, may still be loading their model)."""
    if worker_dns_refresh_s > 0:
        pool = WorkerPool({}, security=security, breaker=breaker, shared_streams=shared_streams)
        cleanup.push_async_callback(pool.close)
        discovery = WorkerDiscovery(pool, workers, refresh_s=worker_dns_refresh_s)
        cleanup.push_async_callback(discovery.close)
        await discovery.start()
    else:
        pool = WorkerPool(workers, security=security, breaker=breaker, shared_streams=shared_streams)
        cleanup.push_async_callback(pool.close)
    collector = WorkerStatsCollector(pool)
    prometheus_client.REGISTRY.register(collector)
    cleanup.callback(prometheus_client.REGISTRY.unregister, collector)
    await pool.start()
    first = await _first_answering(pool, wait_for_workers_s)
    info = await first.stub.GetInfo(worker_pb2.GetInfoRequest())
    tokenizer_channel = open_channel(tokenizer_address, security=security)
    cleanup.push_async_callback(tokenizer_channel.close)
    # Generated text is detokenized here when the tokenizer hands out its decoder.
    decoder = await load_decoder(tokenizer_pb2_grpc.TokenizerStub(tokenizer_channel))
    # Every tokenizer call gets the request's remaining time as its deadline (deadline.py).
    tokenizer = cast(
        tokenizer_pb2_grpc.TokenizerStub, DeadlineStub(tokenizer_pb2_grpc.TokenizerStub(tokenizer_channel))
    )
    lookup = None
    if kvstore_address:
        # The workers' layout keys the kvstore's chunks; the gateway asks with the same one.
        lookup = KvStoreLookup(kvstore_address, info.kv_layout, security=security)
        cleanup.push_async_callback(lookup.close)
    pipeline = Pipeline(
        pool,
        tokenizer,
        create_policy(routing),
        create_policy(routing),
        prefix_lookup=lookup,
        migration_limit=migration_limit,
        request_timeout_s=request_timeout_s,
        admission=Admission(pool, admission),
        decoder=decoder,
        disagg=disagg,
    )
    default_max_tokens = info.default_max_tokens if info.HasField("default_max_tokens") else None
    return GatewayParts(
        served_model or info.model,
        info.max_model_len,
        pipeline,
        pool,
        tokenizer,
        default_max_tokens,
        max_logprobs=info.max_logprobs if info.HasField("max_logprobs") else None,
        vocab_size=info.vocab_size or None,
        takes_images=info.takes_images,
    )


async def _first_answering(pool: WorkerPool, wait_s: float, report_every_s: float = 10.0) -> Endpoint:
    """The first worker whose polls succeed; the pool's own polling brings them in."""
    started = time.monotonic()
    reported = started
    while True:
        first = next((e for e in pool.endpoints if e.healthy), None)
        if first is not None:
            return first
        now = time.monotonic()
        if now - started >= wait_s:
            raise RuntimeError(
                f"no worker answered within {wait_s:g} s; check the worker addresses "
                f"({', '.join(e.address for e in pool.endpoints) or 'none resolved'})"
            )
        if now - reported >= report_every_s:
            reported = now
            log.info("waiting for a worker to answer", seconds=round(now - started))
        await asyncio.sleep(0.5)
