"""The serving room's one entry point: `Serving.generate(spec)`, a request's events.

A request is admitted to a decode (or colocated) worker first, and holds that slot through its
prefill: a prompt's KV is computed only when a worker can take it before the handoff's lease
ends. Then its route is chosen (route.py), its prompt computed where the route says (prefill.py)
and its tokens streamed (decode.py), each step a transition of its life (lifecycle.py).
Cancellation (the client went away) cancels the gRPC calls, which makes each worker abort the
request and free its KV; a handoff whose decode never started is released through the decode
worker as the request leaves HANDED_OFF.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import replace
from typing import Protocol

import grpc
import grpc.aio
import structlog

from cleave.common.v1 import common_pb2
from cleave.tokenizer.v1 import tokenizer_pb2_grpc
from cleave.worker.v1 import worker_pb2
from libs.config.roles import Role
from libs.gateway.common import deadline, errors, metrics, vllm_metrics
from libs.gateway.common.deadline import NO_DEADLINE, Deadline
from libs.gateway.common.generation import Event, Finished, GenerationSpec, check_vocabulary
from libs.gateway.fleet.admission import Admission, Slot
from libs.gateway.fleet.pool import Endpoint, WorkerPool
from libs.gateway.fleet.routing import RoutingPolicy
from libs.gateway.serving import disaggregation
from libs.gateway.serving.decode import Decode
from libs.gateway.serving.disaggregation import DisaggConfig, DisaggInputs, PrefixEstimate
from libs.gateway.serving.lifecycle import Phase, RequestLife
from libs.gateway.serving.migration import DEFAULT_LIMIT
from libs.gateway.serving.picking import picker
from libs.gateway.serving.prefill import Prefill
from libs.gateway.serving.route import Route, RouteChoice, RouteFacts, choose_route, needs_stored_prefix
from libs.tokenization.decoder import Decoder

log = structlog.get_logger(__name__)

# A handoff the decode worker rejects is prefilled again once.
HANDOFF_ATTEMPTS = 2


class PrefixLookup(Protocol):
    """How many leading tokens of a prompt the kvstore holds (0 when unknown)."""

    async def matched_tokens(
        self,
        request_id: str,
        token_ids: Sequence[int],
        cache_salt: str = "",
        lora: common_pb2.LoraAdapter | None = None,
    ) -> int: ...


class Serving:
    def __init__(
        self,
        pool: WorkerPool,
        tokenizer: tokenizer_pb2_grpc.TokenizerStub,
        prefill_policy: RoutingPolicy,
        decode_policy: RoutingPolicy,
        *,
        prefill_attempts: int = 2,
        request_timeout_s: float | None = 600.0,
        admission: Admission | None = None,
        prefix_lookup: PrefixLookup | None = None,
        skip_prefill_max_tail: int = 256,
        migration_limit: int = DEFAULT_LIMIT,
        decoder: Decoder | None = None,
        disagg: DisaggConfig | None = None,
    ) -> None:
        self._pool = pool
        self._decode_policy = decode_policy
        self._request_timeout_s = request_timeout_s
        self._admission = admission or Admission(pool)
        self._prefix_lookup = prefix_lookup
        self._skip_prefill_max_tail = skip_prefill_max_tail
        # Remote prefill for every request, or per request (disaggregation.py).
        self._disagg = disagg or DisaggConfig()
        self._prefill = Prefill(pool, self._admission, prefill_policy, attempts=prefill_attempts)
        self._decode = Decode(
            pool, self._admission, decode_policy, tokenizer, migration_limit=migration_limit, decoder=decoder
        )

    @property
    def request_timeout_s(self) -> float | None:
        """--request-timeout: the HTTP edge fixes each request's deadline with it."""
        return self._request_timeout_s

    def check(self, spec: GenerationSpec) -> None:
        """The request checks that need the workers' facts (vocabulary), as an ApiError (400).
        A streaming response calls it before it commits to a 200."""
        vocab_size = self._pool.vocab_size()
        if vocab_size is not None:
            check_vocabulary(spec, vocab_size)

    async def generate(self, spec: GenerationSpec) -> AsyncIterator[Event]:
        self.check(spec)
        if spec.deadline is NO_DEADLINE:
            # The HTTP edge fixed it when the request arrived; without it, from now.
            spec = replace(spec, deadline=deadline.current() or Deadline.after(self._request_timeout_s))
        life = RequestLife(spec.request_id)
        try:
            async with aclosing(self._serve(spec, life)) as events:
                async for event in events:
                    if isinstance(event, Finished):
                        # The last event: the caller may stop reading once it has it.
                        await life.to(Phase.DONE)
                    yield event
        except BaseException as error:  # the client going away (GeneratorExit) included
            await life.fail(_describe(error))
            raise

    async def _serve(self, spec: GenerationSpec, life: RequestLife) -> AsyncGenerator[Event, None]:
        role = Role.DECODE if self._admission.serviceable(Role.DECODE) else Role.BOTH
        if not self._admission.serviceable(role):
            raise errors.no_workers(Role.DECODE)
        estimate = PrefixEstimate(self._decode_policy) if self._disagg.conditional else None
        waiting = time.perf_counter()
        async with self._admission.admit(
            role, picker(self._decode_policy, spec, estimate), deadline=spec.deadline
        ) as slot:
            decode = slot.endpoint
            assert decode is not None
            # vLLM's queue time: here the wait for a worker with room (admission control).
            vllm_metrics.queued(spec.model, time.perf_counter() - waiting)
            choice = await self._choose_route(spec, decode, colocated=role is Role.BOTH, estimate=estimate)
            metrics.ROUTES.labels(choice.route.value).inc()
            if choice.route is Route.STORED_PREFIX:
                metrics.PREFILL_SKIPPED.inc()
            if choice.route.prefills_remotely:
                events = self._prefill_then_decode(spec, slot, life)
            else:
                await life.to(Phase.DECODING, why=choice.route.value)
                events = self._decode.stream(spec, slot, life)
            async with aclosing(events) as route_events:
                async for event in route_events:
                    yield event

    async def _choose_route(
        self, spec: GenerationSpec, decode: Endpoint, *, colocated: bool, estimate: PrefixEstimate | None
    ) -> RouteChoice:
        stored = await self._stored_tokens(spec) if needs_stored_prefix(colocated, spec.has_images) else 0
        placement = None
        if self._disagg.conditional and not colocated:
            placement = DisaggInputs(
                prompt_tokens=len(spec.prompt_token_ids),
                cached_tokens=max(stored, estimate.cached_tokens(decode.address) if estimate else 0),
                prefill_queue=disaggregation.prefill_queue(self._pool.routable(Role.PREFILL)),
                decode_load=disaggregation.decode_load(decode),
                prompt_logprobs=spec.sampling.HasField("prompt_logprobs"),
            )
        facts = RouteFacts(
            colocated=colocated,
            has_images=spec.has_images,
            prompt_tokens=len(spec.prompt_token_ids),
            stored_tokens=stored,
            stored_prefix_max_tail=self._skip_prefill_max_tail,
            placement=placement,
        )
        choice = choose_route(facts, self._disagg)
        if choice.placement is not None and placement is not None:
            disaggregation.record(
                choice.placement, placement, request_id=spec.request_id, decode=decode.address
            )
        return choice

    async def _stored_tokens(self, spec: GenerationSpec) -> int:
        """Leading prompt tokens the kvstore holds (0: no kvstore, or prompt logprobs asked)."""
        if self._prefix_lookup is None or spec.sampling.HasField("prompt_logprobs"):
            # Prompt logprobs are the prefill worker's to compute (decode loads the KV).
            return 0
        try:
            async with asyncio.timeout(spec.deadline.timeout()):
                return await self._prefix_lookup.matched_tokens(
                    spec.request_id, spec.prompt_token_ids, spec.cache_salt, spec.lora
                )
        except TimeoutError:
            raise spec.deadline.exceeded() from None

    async def _prefill_then_decode(
        self, spec: GenerationSpec, decode: Slot, life: RequestLife
    ) -> AsyncGenerator[Event, None]:
        for _attempt in range(HANDOFF_ATTEMPTS):
            await life.to(Phase.PREFILLING, why=life.why)
            prefilled = await self._prefill.run(spec, life)
            if prefilled.handoff is None:
                await life.to(Phase.DECODING, why="the first token ended the request; no KV kept")
                stream = self._decode.stream(spec, decode, life, None, prefilled.prompt_logprobs)
            else:
                handoff = prefilled.handoff
                await life.to(
                    Phase.HANDED_OFF,
                    release=functools.partial(self._release, decode, spec.request_id, handoff),
                )
                # With images, decode's prompt is the one the prefill engine ran: its KV positions.
                decode_spec = (
                    replace(spec, prompt_token_ids=prefilled.expanded_prompt)
                    if prefilled.expanded_prompt
                    else spec
                )
                stream = self._decode.stream(decode_spec, decode, life, handoff, prefilled.prompt_logprobs)
            async with aclosing(stream) as events:
                async for event in events:
                    yield event
            if life.phase is not Phase.HANDED_OFF:
                return
            # The decode worker refused the KV (lease expired, transfer failed) before emitting
            # anything: prefill again rather than fail the request.
            metrics.RETRIES.labels("handoff").inc()
            log.warning("decode rejected the KV handoff; prefilling again", reason=life.why)
        raise errors.ApiError(
            503, "KV handoff failed twice; the workers may be overloaded", type_="service_unavailable"
        )

    async def _release(self, decode: Slot, request_id: str, handoff: worker_pb2.KvHandoff) -> None:
        endpoint = decode.endpoint
        if endpoint is None:  # the request was between decode workers: its lease will end
            return
        try:
            await endpoint.stub.ReleaseKv(
                worker_pb2.ReleaseKvRequest(request_id=request_id, handoff=handoff), timeout=5
            )
        except grpc.aio.AioRpcError as error:
            log.warning("could not release prefill KV; its lease will expire", code=error.code().name)


def _describe(error: BaseException) -> str:
    if isinstance(error, GeneratorExit | asyncio.CancelledError):
        return "the client went away"
    if isinstance(error, errors.ApiError):
        return f"{error.status}: {error.message}"
    return str(error) or type(error).__name__
