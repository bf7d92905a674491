"""The worker's request logic, independent of gRPC: validation, sampling, KV handoff,
leases, cancellation, stats. The gRPC servicer (services/worker) only adapts messages."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import structlog
from google.protobuf.descriptor import FieldDescriptor

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2
from libs.encoder.tensors import from_proto
from libs.rpc.errors import FailedPrecondition
from libs.worker import metrics
from libs.worker.config import Role, WorkerConfig
from libs.worker.engine import Engine, EngineStep, TokenLogprob
from libs.worker.errors import InvalidRequest, KvTransferFailed
from libs.worker.handoff import (
    PREFILL_PARAMS,
    check_lease,
    check_peer,
    handoff_from_params,
    params_from_handoff,
    trusted_hosts,
)
from libs.worker.images import decode_images
from libs.worker.layout import check_layout, kv_layout
from libs.worker.sampling import sampling_kwargs
from libs.worker.speculative import spec_decode_stats
from libs.worker.validation import resolve_max_tokens, validate_prompt, validate_token_fields

log = structlog.get_logger(__name__)

_FINISH = {
    "stop": common_pb2.FINISH_REASON_STOP,
    "length": common_pb2.FINISH_REASON_LENGTH,
    "abort": common_pb2.FINISH_REASON_ABORT,
}
_KVSTORE_FIELDS = {f.name: f.type for f in worker_pb2.KvStoreConnectorStats.DESCRIPTOR.fields}


def _kvstore_stats(counters: dict[str, float]) -> worker_pb2.KvStoreConnectorStats:
    stats = worker_pb2.KvStoreConnectorStats()
    for name, value in counters.items():
        kind = _KVSTORE_FIELDS.get(name)
        if kind is not None:
            setattr(stats, name, value if kind == FieldDescriptor.TYPE_DOUBLE else int(value))
    return stats


_ROLES = {
    Role.PREFILL: worker_pb2.ROLE_PREFILL,
    Role.DECODE: worker_pb2.ROLE_DECODE,
    Role.BOTH: worker_pb2.ROLE_BOTH,
}


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
        # Prefill side: request id -> lease expiry (unix seconds) of KV held for a decode.
        self._leases: dict[str, float] = {}
        self._active: set[str] = set()
        self._requests_aborted = 0

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
        embeddings = self._image_embeddings(request.image_embeddings)
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
            response.first_token_logprob.CopyFrom(_logprob_proto(first.logprobs[0]))
        if last.prompt_logprobs is not None:
            response.prompt_logprobs.extend(_prompt_logprobs(last.prompt_logprobs))
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
        self._leases[request_id] = expires
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
        kv_params = self._decode_kv_params(request)
        completion_tokens = 0
        last: EngineStep | None = None
        prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
        prompt_logprobs_sent = False
        embeddings = self._image_embeddings(request.image_embeddings)
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
                    logprobs=[_logprob_proto(lp) for lp in sequence.logprobs],
                    finish_reason=_FINISH.get(
                        sequence.finish_reason or "", common_pb2.FINISH_REASON_UNSPECIFIED
                    ),
                )
                if sequence.stop_token_id is not None:
                    chunk.stop_token_id = sequence.stop_token_id
                if prompt_logprobs is not None and not prompt_logprobs_sent:
                    chunk.prompt_logprobs.extend(_prompt_logprobs(prompt_logprobs))
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
            complete.prompt_logprobs.extend(_prompt_logprobs(prompt_logprobs))
        yield worker_pb2.GenerateResponse(complete=complete)

    def _decode_kv_params(self, request: worker_pb2.GenerateRequest) -> dict[str, Any] | None:
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
        check_peer(request.handoff, self._trusted_hosts)
        try:
            return params_from_handoff(request.handoff)
        except ValueError as error:
            raise InvalidRequest(str(error)) from error

    # -- cancellation and leases ------------------------------------------------------------
    async def abort(self, request_id: str) -> bool:
        found = request_id in self._active or self._leases.pop(request_id, None) is not None
        await self._engine.abort(request_id)
        # An active request's stream then ends finished (reason abort), so _run counts it not.
        self._requests_aborted += found
        return found

    async def release_kv(self, request: worker_pb2.ReleaseKvRequest) -> None:
        if self._config.role is not Role.DECODE:
            raise WrongRole("ReleaseKv is served by decode workers (they own the KV connector's channel)")
        check_peer(request.handoff, self._trusted_hosts)
        try:
            params = params_from_handoff(request.handoff)
        except ValueError as error:
            raise InvalidRequest(str(error)) from error
        await self._engine.release_handoff(request.request_id or uuid.uuid4().hex, params)

    def _live_leases(self) -> int:
        now = self._clock()
        for request_id in [r for r, expires in self._leases.items() if expires <= now]:
            del self._leases[request_id]
        return len(self._leases)

    # -- liveness ------------------------------------------------------------------------------
    async def wait_engine_dead(self, poll_s: float = 0.5) -> None:
        """Returns once the engine has died. Polled: vLLM only sets a flag (from its
        engine-core monitor thread); requests in flight fail on their own, with
        EngineUnavailable (gRPC UNAVAILABLE, the worker's failure)."""
        while not self._engine.dead:  # noqa: ASYNC110 (vLLM has a flag, no event)
            await asyncio.sleep(poll_s)
        log.error("the engine died; this worker stops serving")

    # -- info and stats ----------------------------------------------------------------------
    def stats(self) -> worker_pb2.WorkerStats:
        engine = self._engine.stats()
        info = self._engine.info
        return worker_pb2.WorkerStats(
            role=_ROLES[self._config.role],
            num_running=engine.num_running,
            num_waiting=engine.num_waiting,
            kv_cache_usage=engine.kv_cache_usage,
            kv_blocks_total=info.num_kv_blocks,
            num_leased=self._live_leases(),
            prompt_tokens_external=engine.prompt_tokens_external,
            prompt_tokens_computed=engine.prompt_tokens_computed,
            prompt_tokens_local_cache_hit=engine.prompt_tokens_local_cache_hit,
            requests_finished=engine.requests_finished,
            requests_aborted=self._requests_aborted,
            spec_decode=spec_decode_stats(engine.spec_decode),
            kvstore=_kvstore_stats(engine.kvstore),
            kv_pulls=worker_pb2.KvPullStats(
                transfers=int(engine.kv_pulls.get("transfers", 0)),
                seconds=float(engine.kv_pulls.get("seconds", 0.0)),
                bytes=int(engine.kv_pulls.get("bytes", 0)),
                failures=int(engine.kv_pulls.get("failures", 0)),
            ),
        )

    def info(self) -> worker_pb2.WorkerInfo:
        info = self._engine.info
        return worker_pb2.WorkerInfo(
            role=_ROLES[self._config.role],
            model=info.model,
            max_model_len=info.max_model_len,
            vocab_size=info.vocab_size,
            kv_layout=self._layout,
            max_num_seqs=self._config.max_num_seqs,
            engine_version=info.engine_version,
            device=self._config.device.value,
            device_group=self._config.device_group,
            default_max_tokens=_default_max_tokens(info.sampling_defaults),
            max_logprobs=self._config.max_logprobs,
            takes_images=info.takes_images,
            generate_many=True,
        )

    # -- helpers -----------------------------------------------------------------------------
    def _validate(
        self, metadata: common_pb2.RequestMetadata, prompt: list[int], sampling: common_pb2.SamplingParams
    ) -> None:
        info = self._engine.info
        if metadata.model and metadata.model != self._config.served_model_name:
            raise InvalidRequest(
                f"model {metadata.model!r} is not served here; this worker serves {self._config.served_model_name!r}"
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
    ) -> AsyncIterator[EngineStep]:
        """Streams engine steps; if the caller goes away (cancellation), aborts the request."""
        if request_id in self._active:
            raise InvalidRequest(f"request id {request_id!r} is already running on this worker")
        self._active.add(request_id)
        finished = False
        try:
            async for step in self._engine.generate(
                request_id,
                prompt,
                sampling,
                kv_params,
                cache_salt=cache_salt,
                **({"image_embeddings": image_embeddings} if image_embeddings else {}),
                **({"images": images} if images else {}),
            ):
                finished = step.finished
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

    def _image_embeddings(self, tensors: Sequence[common_pb2.Tensor]) -> list[Any]:
        """The request's image embeddings as tensors; refused where vLLM would refuse them."""
        if not tensors:
            return []
        if not self._config.enable_mm_embeds:
            raise InvalidRequest("this worker takes no image embeddings (start it with --enable-mm-embeds)")
        try:
            return [from_proto(tensor) for tensor in tensors]
        except ValueError as error:
            raise InvalidRequest(str(error)) from error


def _logprob_proto(logprob: TokenLogprob) -> common_pb2.TokenLogprob:
    return common_pb2.TokenLogprob(
        token_id=logprob.token_id,
        logprob=logprob.logprob,
        rank=logprob.rank,
        top=[common_pb2.TopLogprob(token_id=t.token_id, logprob=t.logprob, rank=t.rank) for t in logprob.top],
    )


def _prompt_logprobs(entries: tuple[TokenLogprob | None, ...]) -> list[common_pb2.TokenLogprob]:
    # The first prompt token has no logprob; the contract marks it with an empty entry.
    return [common_pb2.TokenLogprob() if e is None else _logprob_proto(e) for e in entries]


def _default_max_tokens(defaults: Mapping[str, Any]) -> int | None:
    """vLLM names generation_config.json's max_new_tokens `max_tokens` in its defaults."""
    value = defaults.get("max_tokens")
    return int(value) if value is not None else None
