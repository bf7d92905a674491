"""The worker's request logic, independent of gRPC: validation, sampling, KV handoff,
leases, cancellation. The gRPC servicer (services/worker) only adapts messages; engine
outputs become messages in outputs.py, stats and info in reports.py."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import Any

import structlog

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2
from libs.config.roles import Role
from libs.rpc.errors import FailedPrecondition
from libs.worker import metrics
from libs.worker.capacity import InflightRequests, default_limit
from libs.worker.config import WorkerConfig
from libs.worker.drain import DrainState, drain_worker
from libs.worker.engine import Adapter, Engine, EngineStep, TokenLogprob
from libs.worker.errors import InvalidRequest, KvTransferFailed
from libs.worker.handoff import (
    PREFILL_PARAMS,
    check_arrival,
    check_lease,
    check_peer,
    handoff_from_params,
    params_from_handoff,
    trusted_hosts,
)
from libs.worker.images import decode_images, image_embeddings
from libs.worker.layout import check_layout, kv_layout
from libs.worker.leases import Leases
from libs.worker.outputs import FINISH_REASONS, logprob_proto, prompt_logprobs_proto
from libs.worker.peers import DnsPeers
from libs.worker.reports import kv_cache_events, worker_info, worker_stats
from libs.worker.sampling import sampling_kwargs
from libs.worker.validation import (
    adapter_of,
    resolve_max_tokens,
    sequence_prefixes,
    validate_prompt,
    validate_token_fields,
)

log = structlog.get_logger(__name__)


class WrongRole(FailedPrecondition):
    """The call needs a role this worker does not have (gRPC FAILED_PRECONDITION)."""


class WorkerService:
    def __init__(
        self,
        config: WorkerConfig,
        engine: Engine,
        *,
        address: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._engine = engine
        self._address = address
        self._clock = clock
        self._layout = kv_layout(engine.info)
        self._trusted_hosts = trusted_hosts(config.kv_host, config.kv_allowed_hosts)
        self._dns_peers = DnsPeers(config.kv_allowed_dns) if config.kv_allowed_dns else None
        self._leases = Leases()  # prefill side: KV held for decode workers
        # Every request running here, Prefill and Generate, at most --max-inflight-requests.
        self._active = InflightRequests(
            config.max_inflight_requests
            or default_limit(engine.info.scheduler.max_num_seqs or config.max_num_seqs)
        )
        self._requests_aborted = 0
        self._drain = DrainState()

    # -- prefill ---------------------------------------------------------------------------
    async def prefill(self, request: worker_pb2.PrefillRequest) -> worker_pb2.PrefillResponse:
        if self._config.role is not Role.PREFILL:
            raise WrongRole(f"Prefill needs a prefill worker; this one is {self._config.role.value}")
        request_id = request.metadata.request_id or uuid.uuid4().hex
        prompt = list(request.prompt_token_ids)
        self._validate(request.metadata, prompt, request.sampling)
        # The prefill computes the prompt and samples one token; decode produces the output.
        sampling = sampling_kwargs(
            request.sampling, max_tokens=1, defaults=self._engine.info.sampling_defaults
        )
        sampling["n"] = 1
        # min_tokens holds back EOS and stop tokens for the first token here; more would be
        # more than this one token (vLLM refuses min_tokens > max_tokens).
        sampling["min_tokens"] = min(sampling["min_tokens"], 1)
        embeddings = image_embeddings(request.image_embeddings, enabled=self._config.enable_mm_embeds)
        images = await self._images(request.images, embeddings)
        started = time.perf_counter()
        last = await self._run_to_end(
            request_id,
            prompt,
            sampling,
            PREFILL_PARAMS,
            cache_salt=request.metadata.cache_salt,
            image_embeddings=embeddings,
            images=images,
            lora=adapter_of(request.metadata),
        )
        metrics.PREFILL_SECONDS.observe(time.perf_counter() - started)
        first = last.sequences[0]
        response = worker_pb2.PrefillResponse(
            first_token_id=first.token_ids[0],
            usage=common_pb2.Usage(
                prompt_tokens=len(prompt), completion_tokens=1, cached_prompt_tokens=last.num_cached_tokens
            ),
        )
        if last.prompt_token_ids is not None:
            # Images: the expanded prompt, which the decode worker's KV positions follow.
            response.prompt_token_ids.extend(last.prompt_token_ids)
            response.usage.prompt_tokens = len(last.prompt_token_ids)
        if first.logprobs:
            response.first_token_logprob.CopyFrom(logprob_proto(first.logprobs[0]))
        if last.prompt_logprobs is not None:
            response.prompt_logprobs.extend(prompt_logprobs_proto(last.prompt_logprobs))
        if first.finish_reason == "stop":
            # EOS or a stop token came first: vLLM freed the blocks, nothing to hand over.
            response.finish_reason = common_pb2.FINISH_REASON_STOP
            return response
        if request.sampling.HasField("max_tokens") and request.sampling.max_tokens == 1:
            response.finish_reason = common_pb2.FINISH_REASON_LENGTH
        if last.kv_transfer_params is None:
            raise RuntimeError("vLLM returned no kv_transfer_params for a prefill; is the KV connector on?")
        expires = self._clock() + self._config.kv_lease_s
        handoff = handoff_from_params(
            last.kv_transfer_params, lease_expires_unix_ms=int(expires * 1000), worker_address=self._address
        )
        handoff.layout.CopyFrom(self._layout)
        response.handoff.CopyFrom(handoff)
        self._leases.grant(request_id, expires, self._engine.stats())
        log.debug(
            "prefill done", prompt_tokens=len(prompt), blocks=sum(len(g.ids) for g in handoff.block_ids)
        )
        return response

    # -- generate (decode / colocated) -----------------------------------------------------
    async def generate(
        self, request: worker_pb2.GenerateRequest
    ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        if self._config.role is Role.PREFILL:
            raise WrongRole("Generate needs a decode or both worker; this one is prefill")
        request_id = request.metadata.request_id or uuid.uuid4().hex
        prompt = list(request.prompt_token_ids)
        self._validate(request.metadata, prompt, request.sampling)
        max_tokens = resolve_max_tokens(
            request.sampling.max_tokens if request.sampling.HasField("max_tokens") else None,
            prompt_len=len(prompt),
            max_model_len=self._engine.info.max_model_len,
        )
        sampling = sampling_kwargs(
            request.sampling, max_tokens=max_tokens, defaults=self._engine.info.sampling_defaults
        )
        kv_params = await self._decode_kv_params(request)
        moved_alone = kv_params is None and not (request.images or request.image_embeddings)
        prefixes = sequence_prefixes(
            request.sequences, n=sampling["n"], max_tokens=max_tokens, moved_alone=moved_alone
        )
        completion_tokens = 0
        last: EngineStep | None = None
        prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
        prompt_logprobs_sent = False
        embeddings = image_embeddings(request.image_embeddings, enabled=self._config.enable_mm_embeds)
        images = await self._images(request.images, embeddings)
        num_prompt_tokens = len(prompt)
        async for step in self._run(
            request_id,
            prompt,
            sampling,
            kv_params,
            cache_salt=request.metadata.cache_salt,
            image_embeddings=embeddings,
            images=images,
            lora=adapter_of(request.metadata),
            handoff=request.handoff if kv_params is not None else None,
            **({"sequences": prefixes} if prefixes else {}),
        ):
            last = step
            if step.prompt_token_ids is not None:
                num_prompt_tokens = len(step.prompt_token_ids)
            if step.prompt_logprobs is not None:
                prompt_logprobs = step.prompt_logprobs  # on the first step only
            for sequence in step.sequences:
                if sequence.finish_reason == "error":
                    # vLLM failed the request itself (with the "fail" load policy: handed-over
                    # KV that could not be loaded). Never a quiet, empty "success".
                    if kv_params is not None:
                        raise KvTransferFailed("the engine could not load the handed-over KV; prefill again")
                    raise RuntimeError("the engine failed the request (vLLM finish reason 'error')")
                completion_tokens += len(sequence.token_ids)
                if not sequence.token_ids and sequence.finish_reason is None:
                    continue
                chunk = worker_pb2.TokenChunk(
                    index=sequence.index,
                    token_ids=sequence.token_ids,
                    logprobs=[logprob_proto(lp) for lp in sequence.logprobs],
                    finish_reason=FINISH_REASONS.get(
                        sequence.finish_reason or "", common_pb2.FINISH_REASON_UNSPECIFIED
                    ),
                )
                if sequence.stop_token_id is not None:
                    chunk.stop_token_id = sequence.stop_token_id
                if prompt_logprobs is not None and not prompt_logprobs_sent:
                    chunk.prompt_logprobs.extend(prompt_logprobs_proto(prompt_logprobs))
                    prompt_logprobs_sent = True
                yield worker_pb2.GenerateResponse(chunk=chunk)
        complete = worker_pb2.GenerateComplete(
            usage=common_pb2.Usage(
                prompt_tokens=num_prompt_tokens,
                completion_tokens=completion_tokens,
                cached_prompt_tokens=last.num_cached_tokens if last else 0,
            )
        )
        if prompt_logprobs is not None:
            complete.prompt_logprobs.extend(prompt_logprobs_proto(prompt_logprobs))
        yield worker_pb2.GenerateResponse(complete=complete)

    async def _decode_kv_params(self, request: worker_pb2.GenerateRequest) -> dict[str, Any] | None:
        if not request.HasField("handoff"):
            if self._config.role is Role.DECODE:
                # Not an error (the gateway may choose it), but never silent: counted and logged.
                metrics.LOCAL_PREFILLS.inc()
                log.info("no KV handoff: computing the prompt on the decode worker")
            return None
        if self._config.role is Role.BOTH:
            raise InvalidRequest(
                "this worker is colocated (role both) and has no KV connector; send no handoff"
            )
        check_layout(self._layout, request.handoff.layout)
        check_lease(request.handoff, self._clock())
        await self._check_peer(request.handoff)
        return params_from_handoff(request.handoff)

    # -- LoRA adapters -----------------------------------------------------------------------
    async def load_lora_adapter(self, request: worker_pb2.LoadLoraAdapterRequest) -> None:
        """Loads the adapter into the engine now (what a request naming it would do first)."""
        metadata = common_pb2.RequestMetadata(lora=request.adapter)
        if not self._config.enable_lora:
            raise InvalidRequest("this worker serves no LoRA adapters (--enable-lora)")
        adapter = adapter_of(metadata)
        if adapter is None:
            raise InvalidRequest("an adapter (name and path) is required")
        await self._engine.load_lora(adapter)

    # -- leases ------------------------------------------------------------------------------
    async def release_kv(self, request: worker_pb2.ReleaseKvRequest) -> None:
        if self._config.role is not Role.DECODE:
            raise WrongRole("ReleaseKv is served by decode workers (they own the KV connector's channel)")
        await self._check_peer(request.handoff)
        params = params_from_handoff(request.handoff)
        await self._engine.release_handoff(request.request_id or uuid.uuid4().hex, params)

    async def _check_peer(self, handoff: worker_pb2.KvHandoff) -> None:
        resolved = await self._dns_peers.addresses(handoff.host) if self._dns_peers else frozenset()
        check_peer(handoff, self._trusted_hosts, resolved)

    def _live_leases(self) -> int:
        return self._leases.live(self._clock(), self._engine.stats())

    # -- info and stats ----------------------------------------------------------------------
    def stats(self) -> worker_pb2.WorkerStats:
        return worker_stats(
            self._config.role,
            self._engine.stats(),
            self._engine.info,
            num_leased=self._live_leases(),
            requests_aborted=self._requests_aborted,
            num_inflight=len(self._active),
        )

    def info(self) -> worker_pb2.WorkerInfo:
        feed = self._engine.kv_cache_feed
        return worker_info(
            self._config,
            self._engine.info,
            self._layout,
            feed.hasher if feed is not None else None,
            max_inflight_requests=self._active.limit,
        )

    @property
    def num_inflight(self) -> int:
        """Requests running here now (each GenerateMany message carries it)."""
        return len(self._active)

    def watch_kv_cache(self) -> AsyncGenerator[worker_pb2.KvCacheEvents, None]:
        feed = self._engine.kv_cache_feed
        if feed is None:
            raise FailedPrecondition("this worker's engine publishes no KV cache events")
        return kv_cache_events(feed.watch())

    # -- drain (drain.py) ----------------------------------------------------------------------
    @property
    def draining(self) -> bool:
        return self._drain.draining

    @property
    def drain_state(self) -> DrainState:
        return self._drain

    async def drain(self, deadline: float) -> None:
        """Stops taking requests, lets the running ones finish (and, on a prefill worker, its
        handed-over KV be pulled) until shortly before `deadline` (the loop's time), then hands
        off what is left (drain.py)."""
        await drain_worker(self._drain, self._active, self._live_leases, self._engine.abort, deadline)

    # -- liveness ------------------------------------------------------------------------------
    async def wait_engine_dead(self, poll_s: float = 0.5) -> None:
        """Returns once the engine has died. Polled: vLLM only sets a flag (from its
        engine-core monitor thread); requests in flight fail on their own, with
        EngineUnavailable (gRPC UNAVAILABLE, the worker's failure)."""
        while not self._engine.dead:  # noqa: ASYNC110 (vLLM has a flag, no event)
            await asyncio.sleep(poll_s)
        log.error("the engine died; this worker stops serving")

    # -- helpers -----------------------------------------------------------------------------
    def _validate(
        self, metadata: common_pb2.RequestMetadata, prompt: list[int], sampling: common_pb2.SamplingParams
    ) -> None:
        info = self._engine.info
        if metadata.model and metadata.model != self._config.served_model_name:
            raise InvalidRequest(
                f"model {metadata.model!r} is not served here; this worker serves {self._config.served_model_name!r}"
            )
        if metadata.HasField("lora") and not self._config.enable_lora:
            raise InvalidRequest(
                f"LoRA adapter {metadata.lora.name!r} asked for, but this worker serves no adapters (--enable-lora)"
            )
        validate_prompt(prompt, vocab_size=info.vocab_size, max_model_len=info.max_model_len)
        validate_token_fields(sampling, vocab_size=info.vocab_size)

    async def _run(
        self,
        request_id: str,
        prompt: list[int],
        sampling: dict[str, Any],
        kv_params: dict[str, Any] | None,
        *,
        cache_salt: str = "",
        image_embeddings: Sequence[Any] = (),
        images: Sequence[Any] = (),
        lora: Adapter | None = None,
        handoff: worker_pb2.KvHandoff | None = None,
        **more: Any,
    ) -> AsyncIterator[EngineStep]:
        """Streams engine steps; aborts the request if the caller goes away. While draining,
        refuses new requests and ends handed-off ones (drain.py). KV that came by `handoff`
        must have arrived within its lease (check_arrival)."""
        self._drain.check_accepting()
        if request_id in self._active:
            raise InvalidRequest(f"request id {request_id!r} is already running on this worker")
        self._active.admit(request_id)  # or AtCapacity: the caller waits for room (capacity.py)
        finished = False
        try:
            async for step in self._engine.generate(
                request_id,
                prompt,
                sampling,
                kv_params,
                cache_salt=cache_salt,
                lora=lora,
                **({"image_embeddings": image_embeddings} if image_embeddings else {}),
                **({"images": images} if images else {}),
                **more,  # sequences: a moved request's open sequences  # sequences: a moved request's open sequences
            ):
                self._drain.check_running(request_id)
                if handoff is not None:
                    check_arrival(handoff, self._clock())
                    handoff = None
                finished = step.finished
                if finished:
                    # Out of the count before its last step leaves: the gateway that reads it
                    # may send its next request here at once, and must find the room.
                    self._active.discard(request_id)
                yield step
        finally:
            self._active.discard(request_id)
            if not finished:
                # Cancelled or failed mid-way: free the engine's KV now, not at some timeout.
                self._requests_aborted += 1
                await asyncio.shield(self._engine.abort(request_id))
                log.info("request aborted", request_id=request_id)

    async def _run_to_end(
        self,
        request_id: str,
        prompt: list[int],
        sampling: dict[str, Any],
        kv_params: dict[str, Any],
        *,
        cache_salt: str,
        image_embeddings: Sequence[Any] = (),
        images: Sequence[Any] = (),
        lora: Adapter | None = None,
    ) -> EngineStep:
        last: EngineStep | None = None
        prompt_token_ids: tuple[int, ...] | None = None
        async for step in self._run(
            request_id,
            prompt,
            sampling,
            kv_params,
            cache_salt=cache_salt,
            image_embeddings=image_embeddings,
            images=images,
            lora=lora,
        ):
            last = step
            prompt_token_ids = step.prompt_token_ids or prompt_token_ids
        if last is None or not last.sequences or not last.sequences[0].token_ids:
            raise RuntimeError("the engine finished a prefill without producing a token")
        return replace(last, prompt_token_ids=prompt_token_ids) if prompt_token_ids else last

    async def _images(self, files: Sequence[bytes], embeddings: Sequence[Any]) -> list[Any]:
        """The request's image files decoded for the engine's own vision tower (no encoder)."""
        return await decode_images(
            files, takes_images=self._engine.info.takes_images, with_embeddings=bool(embeddings)
        )
