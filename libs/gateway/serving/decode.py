"""A request's tokens from its decode (or colocated) worker -> per-sequence events: text through
the detokenizers (stop strings applied), logprobs, finish and stop reasons; and the request
moved to another worker when its worker fails after tokens were sent (migration.py).

The request's phase (lifecycle.py) says what a failure means: before the first token it is an
HTTP error (a handoff the decode worker rejects leaves the request HANDED_OFF, for the caller
to prefill again; a refusal by a draining worker, or one at its bound on running requests,
sends the same request to another worker or the first with room, since nothing of it ran);
after it, the worker's own failure moves the request (MIGRATING) and any
other ends the stream with an error event (MidStreamError).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import structlog

from cleave.common.v1 import common_pb2
from cleave.tokenizer.v1 import tokenizer_pb2_grpc
from cleave.worker.v1 import worker_pb2
from libs.gateway.common import errors, metrics
from libs.gateway.common.deadline import Deadline
from libs.gateway.common.errors import MidStreamError
from libs.gateway.common.generation import Event, Finished, GenerationSpec, SequenceEvent
from libs.gateway.fleet.admission import Admission, Slot
from libs.gateway.fleet.pool import Endpoint, WorkerPool
from libs.gateway.fleet.routing import RoutingPolicy
from libs.gateway.serving.detokenize import SequenceDetokenizer
from libs.gateway.serving.lifecycle import Phase, RequestLife
from libs.gateway.serving.local_detokenize import LocalSequenceDetokenizer
from libs.gateway.serving.migration import MIGRATING_CODES, Migration, MigrationRefused
from libs.gateway.serving.worker_errors import api_error, worker_error
from libs.rpc import at_capacity, draining
from libs.tokenization.decoder import Decoder

log = structlog.get_logger(__name__)

_EJECTING = {grpc.StatusCode.UNAVAILABLE}
# Workers a request may be refused by for draining before one takes it (each is excluded).
MAX_REROUTES = 3
_FINISH = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_ABORT: "abort",
}


@dataclass
class _Progress:
    """What a request's stream produced so far; kept when the request moves to another worker."""

    detokenizers: dict[int, SequenceDetokenizer | LocalSequenceDetokenizer]
    open_sequences: set[int]
    completion_tokens: int = 0
    prompt_logprobs: list[common_pb2.TokenLogprob] | None = None
    prompt_logprobs_sent: set[int] = field(default_factory=set)  # sequences whose first event had them
    # Workers that refused the request because they were draining (nothing of it ran there).
    refused_by: list[str] = field(default_factory=list)
    # The last worker refused it (draining, or at its bound): send it to another, or (at its
    # bound) to the first with room, that one included.
    rerouted: bool = False
    at_capacity: bool = False
    # A stop string ended a sequence here while its engine still runs it.
    stopped_here: bool = False


class Decode:
    def __init__(
        self,
        pool: WorkerPool,
        admission: Admission,
        policy: RoutingPolicy,
        tokenizer: tokenizer_pb2_grpc.TokenizerStub,
        *,
        migration_limit: int,
        decoder: Decoder | None = None,
    ) -> None:
        self._pool = pool
        self._admission = admission
        self._policy = policy
        self._tokenizer = tokenizer
        self._migration_limit = migration_limit
        # The tokenizer's decoder (local_detokenize.py): output is detokenized in this process;
        # None: through the tokenizer service's DetokenizeStream.
        self._decoder = decoder

    async def stream(
        self,
        spec: GenerationSpec,
        slot: Slot,
        life: RequestLife,
        handoff: worker_pb2.KvHandoff | None = None,
        prompt_logprobs: list[common_pb2.TokenLogprob] | None = None,
    ) -> AsyncGenerator[Event, None]:
        """The request's events from the slot's worker (and the workers it moves to, the slot
        with it). `handoff`: the prompt's KV on a prefill worker (the request is HANDED_OFF);
        None: computed here."""
        request = _generate_request(spec, handoff, prompt_logprobs)
        detokenizers = {
            i: self._detokenizer(
                request_id=spec.request_id,
                prompt_tail=spec.prompt_token_ids[-5:],
                stops=spec.stops,
                skip_special_tokens=spec.sampling.skip_special_tokens,
                include_stop_str_in_output=spec.include_stop_str_in_output,
                deadline=spec.deadline,
            )
            for i in range(spec.sampling.n or 1)
        }
        progress = _Progress(detokenizers, set(detokenizers), prompt_logprobs=prompt_logprobs)
        migration = Migration(request, limit=self._migration_limit, images=spec.has_images)
        endpoint = slot.endpoint
        assert endpoint is not None  # the caller holds it
        try:
            while True:
                events = self._worker_stream(spec, endpoint, request, progress, migration, life)
                async with aclosing(events) as worker_events:
                    async for event in worker_events:
                        yield event
                if progress.rerouted:
                    endpoint = await self._reroute(spec, slot, progress, migration)
                    continue
                if life.phase is not Phase.MIGRATING:
                    return  # done, or (HANDED_OFF) the handoff was rejected
                endpoint, request = await self._move(spec, slot, migration, life, progress)
        finally:
            for detokenizer in detokenizers.values():
                detokenizer.close()

    def _detokenizer(
        self, *, deadline: Deadline, **session: Any
    ) -> SequenceDetokenizer | LocalSequenceDetokenizer:
        """One sequence's detokenizer: in this process when the tokenizer gave its decoder."""
        if self._decoder is not None:
            return LocalSequenceDetokenizer(self._decoder, **session)
        return SequenceDetokenizer(self._tokenizer, deadline=deadline, **session)

    async def _move(
        self,
        spec: GenerationSpec,
        slot: Slot,
        migration: Migration,
        life: RequestLife,
        progress: _Progress,
    ) -> tuple[Endpoint, worker_pb2.GenerateRequest]:
        """The worker and request that continue a request its worker failed mid-stream
        (migration.py). The slot moves to the new worker; waiting for one counts against the
        request's deadline like any other."""
        failed_endpoint = slot.endpoint
        assert failed_endpoint is not None
        try:
            plan = migration.plan(failed_endpoint, life.why, self._admission, progress.open_sequences)
        except MigrationRefused as refused:
            if not migration.sent:  # the client has no response yet: an HTTP status
                raise errors.ApiError(503, f"{refused}; retry later", type_="service_unavailable") from None
            raise MidStreamError(str(refused)) from None
        prompt = list(plan.request.prompt_token_ids)
        endpoint = await self._admission.move(
            slot,
            lambda candidates: self._policy.pick(candidates, prompt, spec.cache_salt, spec.lora),
            role=plan.role,
            exclude=migration.failed,
            deadline=spec.deadline,
        )
        migration.moved_to(endpoint, life.why)
        # Nothing sent yet: the request is simply decoding elsewhere (an error is still a status).
        await life.to(
            Phase.STREAMING if migration.sent else Phase.DECODING, why=f"moved to {endpoint.address}"
        )
        return endpoint, plan.request

    async def _reroute(
        self, spec: GenerationSpec, slot: Slot, progress: _Progress, migration: Migration
    ) -> Endpoint:
        """A worker of the same role for a request its worker refused before running any of it:
        draining (another worker) or at its bound (the first with room, that one included). The
        same request (its handoff too) goes there unchanged; waiting for room counts against the
        request's deadline, and the slot moves with it."""
        progress.rerouted = False
        if progress.at_capacity:
            progress.at_capacity = False
            metrics.RETRIES.labels("at_capacity").inc()
        else:
            if len(progress.refused_by) > MAX_REROUTES:
                raise errors.ApiError(
                    503, "the workers are shutting down; retry later", type_="service_unavailable"
                )
            metrics.RETRIES.labels("draining").inc()
            log.info("worker draining; sending the request to another", refused_by=progress.refused_by[-1])
        prompt = list(spec.prompt_token_ids)
        return await self._admission.move(
            slot,
            lambda candidates: self._policy.pick(candidates, prompt, spec.cache_salt, spec.lora),
            exclude=frozenset(progress.refused_by) | migration.failed,
            deadline=spec.deadline,
        )

    async def _worker_stream(
        self,
        spec: GenerationSpec,
        endpoint: Endpoint,
        request: worker_pb2.GenerateRequest,
        progress: _Progress,
        migration: Migration,
        life: RequestLife,
    ) -> AsyncGenerator[Event, None]:
        """One worker's Generate stream as events. Ends with the request DONE-ready (its
        Finished yielded), MIGRATING (the worker's own failure after tokens were sent) or still
        HANDED_OFF (the decode worker rejected the handoff); raises for other failures."""
        call = endpoint.generate(request, spec.deadline.grpc_timeout())
        try:
            async for response in call:
                kind = response.WhichOneof("kind")
                if kind == "error":
                    engine_stopped = response.error.code == common_pb2.ERROR_CODE_OVERLOADED
                    if engine_stopped:
                        # The worker's own failure (its engine stopped), as UNAVAILABLE below.
                        self._pool.request_failed(endpoint, "generate failed: engine unavailable")
                        await life.to(Phase.MIGRATING, why=_failed(life, response.error.message))
                        return
                    if not life.sent_tokens:
                        raise worker_error(response.error)
                    raise MidStreamError(response.error.message)
                self._pool.request_succeeded(endpoint)  # it generates: a half-open probe passed
                if life.phase is Phase.HANDED_OFF:
                    await life.to(Phase.DECODING, why="the decode worker took the handoff")
                if kind == "complete":
                    yield self._finished(spec, response.complete, progress, migration)
                    return
                chunk = response.chunk
                if chunk.prompt_logprobs and progress.prompt_logprobs is None:
                    progress.prompt_logprobs = list(chunk.prompt_logprobs)
                if chunk.index not in progress.open_sequences:
                    continue
                event = await _sequence_event(spec, chunk, progress)
                if progress.prompt_logprobs is not None and chunk.index not in progress.prompt_logprobs_sent:
                    progress.prompt_logprobs_sent.add(chunk.index)
                    event.prompt_logprobs = progress.prompt_logprobs
                migration.record(chunk.index, chunk.token_ids)
                if not life.sent_tokens:
                    await life.to(Phase.STREAMING)
                yield event
                if event.finish_reason is not None:
                    progress.open_sequences.discard(chunk.index)
                    if chunk.finish_reason == common_pb2.FINISH_REASON_UNSPECIFIED:
                        progress.stopped_here = True
                    if not progress.open_sequences and progress.stopped_here:
                        # Stop strings ended the last sequences the engine still runs: stop it
                        # now. When the engine ended them all, its `complete` (with the usage's
                        # cached tokens) follows at once.
                        call.cancel()
                        yield Finished(
                            len(spec.prompt_token_ids),
                            progress.completion_tokens,
                            0,
                            progress.prompt_logprobs,
                        )
                        return
            await life.to(Phase.MIGRATING, why=_failed(life, "the stream closed without completing"))
        except grpc.aio.AioRpcError as error:
            code = error.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED and spec.deadline.expired():
                raise spec.deadline.exceeded() from error
            refused = code == grpc.StatusCode.UNAVAILABLE and draining.is_draining(error.details())
            if code in _EJECTING and not refused:
                self._pool.request_failed(endpoint, f"generate failed: {code.name}")
            if not life.sent_tokens:
                if at_capacity.is_at_capacity(code, error.details()):
                    # Another gateway filled the worker since it last reported: nothing ran.
                    endpoint.refused_at_capacity()
                    progress.at_capacity = progress.rerouted = True
                    return
                if refused:
                    # Draining: it never ran the request (no token, no KV pulled).
                    progress.refused_by.append(endpoint.address)
                    progress.rerouted = True
                    return
                if code == grpc.StatusCode.ABORTED and life.phase is Phase.HANDED_OFF:
                    # The decode worker could not use the KV (lease expired, transfer failed).
                    life.handoff_rejected(error.details() or "KV transfer failed")
                    return
                if code not in MIGRATING_CODES:
                    raise api_error(error) from error
                await life.to(Phase.MIGRATING, why=_failed(life, code.name))
                return
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                # The gateway's own bound on a slow reader (fleet/shared_stream.py), not the worker.
                raise MidStreamError(error.details() or "the client reads too slowly") from error
            if code not in MIGRATING_CODES:
                raise MidStreamError(f"decode worker failed mid-stream: {code.name}") from error
            await life.to(Phase.MIGRATING, why=_failed(life, code.name))
        finally:
            call.cancel()

    @staticmethod
    def _finished(
        spec: GenerationSpec,
        complete: worker_pb2.GenerateComplete,
        progress: _Progress,
        migration: Migration,
    ) -> Finished:
        usage = complete.usage
        # A moved request's worker saw a longer prompt; the client's is the original.
        prompt_tokens = len(spec.prompt_token_ids) if migration.moved else usage.prompt_tokens
        cached = min(usage.cached_prompt_tokens, prompt_tokens)
        if progress.prompt_logprobs is None and complete.prompt_logprobs:
            progress.prompt_logprobs = list(complete.prompt_logprobs)
        return Finished(prompt_tokens, progress.completion_tokens, cached, progress.prompt_logprobs)


def _failed(life: RequestLife, what: str) -> str:
    when = "mid-stream" if life.sent_tokens else "before its first token"
    return f"decode worker failed {when}: {what}"


def _generate_request(
    spec: GenerationSpec,
    handoff: worker_pb2.KvHandoff | None,
    prompt_logprobs: list[common_pb2.TokenLogprob] | None,
) -> worker_pb2.GenerateRequest:
    request = worker_pb2.GenerateRequest(
        metadata=spec.metadata(), prompt_token_ids=spec.prompt_token_ids, sampling=spec.sampling
    )
    if prompt_logprobs is not None:
        # The prefill worker computed them; decode, which loads the KV, does not.
        request.sampling.ClearField("prompt_logprobs")
    if handoff is not None:
        request.handoff.CopyFrom(handoff)
    elif spec.has_images:
        # Computing the prompt here: this worker needs the images too.
        request.image_embeddings.extend(spec.image_embeddings)
        request.images.extend(spec.images)
    return request


async def _sequence_event(
    spec: GenerationSpec, chunk: worker_pb2.TokenChunk, progress: _Progress
) -> SequenceEvent:
    """One chunk's text (stop strings applied), finish and stop reason."""
    detokenizer = progress.detokenizers[chunk.index]
    shown = list(chunk.token_ids)
    stop_token = chunk.stop_token_id if chunk.HasField("stop_token_id") else None
    if stop_token is not None and shown and not spec.include_stop_str_in_output:
        shown = shown[:-1]  # vLLM leaves a stop token's text out unless asked
    if isinstance(detokenizer, LocalSequenceDetokenizer):
        detokenized = detokenizer.feed_now(shown)
    else:
        detokenized = await detokenizer.feed(shown)
    text = detokenized.text
    progress.completion_tokens += len(chunk.token_ids)
    finish = _FINISH.get(chunk.finish_reason)
    stop_reason: int | str | None = stop_token
    if detokenized.stopped:
        finish, stop_reason = "stop", detokenized.matched_stop
    elif finish is not None:
        text += (await detokenizer.finish()).text
    return SequenceEvent(chunk.index, text, list(chunk.token_ids), list(chunk.logprobs), finish, stop_reason)
