"""The request path behind the OpenAI API: prefill (with retry on another worker) -> KV
handoff -> decode stream -> per-sequence detokenization -> events for the HTTP layer.

Colocated (`both`) workers skip the prefill hop, and so do prompts the kvstore holds all
but a short tail of (the decode worker loads the prefix itself). Cancellation (the client went away) cancels
the gRPC calls, which makes each worker abort the request and free its KV; a handoff whose
decode never started is released through a decode worker. A decode worker that fails after
tokens were sent hands the request to another, which continues from the tokens generated
so far (libs/gateway/migration.py).

Fault attribution: a request a worker refuses as invalid (INVALID_ARGUMENT) is the client's
mistake, answered 400 with the worker's message; it is never retried and never ejects the
worker. Only the worker's own failures (unreachable, engine unavailable) eject it. Failures of
the tokenizer's stream are the tokenizer's (libs/gateway/detokenize.py) and eject nobody.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, aclosing
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import grpc
import grpc.aio
import structlog

from cleave.common.v1 import common_pb2
from cleave.tokenizer.v1 import tokenizer_pb2_grpc
from cleave.worker.v1 import worker_pb2
from libs.gateway import deadline, errors, metrics
from libs.gateway.admission import Admission
from libs.gateway.deadline import NO_DEADLINE, Deadline
from libs.gateway.detokenize import SequenceDetokenizer
from libs.gateway.disaggregation import DisaggConfig, DisaggInputs, PrefixEstimate, place
from libs.gateway.disaggregation import decode_load as disagg_decode_load
from libs.gateway.disaggregation import prefill_queue as disagg_prefill_queue
from libs.gateway.generation import Finished as Finished
from libs.gateway.generation import GenerationSpec as GenerationSpec
from libs.gateway.generation import SequenceEvent as SequenceEvent
from libs.gateway.generation import check_vocabulary
from libs.gateway.local_detokenize import LocalSequenceDetokenizer
from libs.gateway.migration import DEFAULT_LIMIT, MIGRATING_CODES, Migration, MigrationRefused, WorkerFailed
from libs.gateway.pool import Endpoint, WorkerPool
from libs.gateway.routing import RoutingPolicy
from libs.gateway.worker_errors import api_error, worker_error
from libs.tokenization.decoder import Decoder

log = structlog.get_logger(__name__)

# Prefill failures that another worker may not have; only the first also ejects the worker
# (unreachable, or its engine is not running). INTERNAL is a bug that may be this request's
# alone, DEADLINE_EXCEEDED may be a busy machine: the stats poller judges those workers.
_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL}
_EJECTING = {grpc.StatusCode.UNAVAILABLE}
_FINISH = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_ABORT: "abort",
}


class PrefixLookup(Protocol):
    """How many leading tokens of a prompt the kvstore holds (0 when unknown)."""

    async def matched_tokens(
        self, request_id: str, token_ids: Sequence[int], cache_salt: str = ""
    ) -> int: ...


class HandoffRejected(Exception):
    """The decode worker could not use the handoff's KV; nothing was emitted yet."""


class MidStreamError(Exception):
    """A worker failed after tokens were sent: the client gets an error event, not a hang."""


@dataclass
class _Progress:
    """What a request's stream produced so far; kept when the request moves to another worker."""

    detokenizers: dict[int, SequenceDetokenizer | LocalSequenceDetokenizer]
    open_sequences: set[int]
    completion_tokens: int = 0
    emitted: bool = False
    prompt_logprobs: list[common_pb2.TokenLogprob] | None = None
    prompt_logprobs_sent: set[int] = field(default_factory=set)  # sequences whose first event had them


class Pipeline:
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
        self._tokenizer = tokenizer
        self._prefill_policy = prefill_policy
        self._decode_policy = decode_policy
        self._prefill_attempts = prefill_attempts
        self._request_timeout_s = request_timeout_s
        self._admission = admission or Admission(pool)
        self._prefix_lookup = prefix_lookup
        self._skip_prefill_max_tail = skip_prefill_max_tail
        self._migration_limit = migration_limit
        # The tokenizer's decoder (local_detokenize.py): output is detokenized in this process;
        # None: through the tokenizer service's DetokenizeStream.
        self._decoder = decoder
        # Remote prefill for every request, or per request (libs/gateway/disaggregation.py).
        self._disagg = disagg or DisaggConfig()

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

    async def run(self, spec: GenerationSpec) -> AsyncIterator[SequenceEvent | Finished]:
        self.check(spec)
        if spec.deadline is NO_DEADLINE:
            # The HTTP edge fixed it when the request arrived; without it, from now.
            spec = replace(spec, deadline=deadline.current() or Deadline.after(self._request_timeout_s))
        # The decode (or colocated) slot is taken first and held through prefill: a prompt's
        # KV is computed only when a worker can take it before the handoff's lease ends.
        role = "decode" if self._admission.serviceable("decode") else "both"
        if not self._admission.serviceable(role):
            raise errors.no_workers("decode")
        estimate = PrefixEstimate(self._decode_policy) if self._disagg.conditional else None
        pick = _picker(self._decode_policy, spec, estimate)
        async with self._admission.admit(role, pick, deadline=spec.deadline) as decode:
            if role == "both":
                async for event in self._generate(spec, decode, None):
                    yield event
                return
            if spec.has_images:
                # Images: always the prefill worker (it has the images; decode takes none).
                # The kvstore keys KV by token ids alone, and every image's placeholders are
                # the same ids, so it is neither asked nor skipped to.
                async for event in self._prefill_then_generate(spec, decode):
                    yield event
                return
            matched = await self._kvstore_matched(spec)
            if matched > 0 and len(spec.prompt_token_ids) - matched <= self._skip_prefill_max_tail:
                # The decode worker loads the stored prefix itself and computes the short tail.
                metrics.PREFILL_SKIPPED.inc()
                async for event in self._generate(spec, decode, worker_pb2.KvHandoff()):
                    yield event
                return
            if not self._remote_prefill(spec, decode, matched, estimate):
                # No handoff: the decode worker computes the prompt (loading any stored prefix).
                async for event in self._generate(spec, decode, worker_pb2.KvHandoff()):
                    yield event
                return
            async for event in self._prefill_then_generate(spec, decode):
                yield event

    async def _prefill_then_generate(
        self, spec: GenerationSpec, decode: Endpoint
    ) -> AsyncIterator[SequenceEvent | Finished]:
        for _attempt in range(2):
            handoff, prompt_logprobs, expanded = await self._prefill(spec)
            # With images, decode's prompt is the one the prefill engine ran (placeholders
            # expanded to one token per embedding): its KV positions.
            decode_spec = replace(spec, prompt_token_ids=expanded) if expanded else spec
            try:
                async for event in self._generate(decode_spec, decode, handoff, prompt_logprobs):
                    yield event
                return
            except HandoffRejected as error:
                # The decode refused the KV (lease expired, transfer failed) before emitting
                # anything: prefill again rather than fail the request.
                metrics.RETRIES.labels("handoff").inc()
                log.warning("decode rejected the KV handoff; prefilling again", reason=str(error))
        raise errors.ApiError(
            503, "KV handoff failed twice; the workers may be overloaded", type_="service_unavailable"
        )

    def _remote_prefill(
        self, spec: GenerationSpec, decode: Endpoint, matched: int, estimate: PrefixEstimate | None
    ) -> bool:
        """The disaggregation policy's decision for this request (counted and logged there)."""
        if not self._disagg.conditional:
            return True
        inputs = DisaggInputs(
            prompt_tokens=len(spec.prompt_token_ids),
            cached_tokens=max(matched, estimate.cached_tokens(decode.address) if estimate else 0),
            prefill_queue=disagg_prefill_queue(self._pool.routable("prefill")),
            decode_load=disagg_decode_load(decode),
            prompt_logprobs=spec.sampling.HasField("prompt_logprobs"),
        )
        return place(self._disagg, inputs, request_id=spec.request_id, decode=decode.address).remote

    async def _kvstore_matched(self, spec: GenerationSpec) -> int:
        """Leading prompt tokens the kvstore holds (0: no kvstore, or prompt logprobs asked)."""
        if self._prefix_lookup is None or spec.sampling.HasField("prompt_logprobs"):
            # Prompt logprobs are the prefill worker's to compute (decode loads the KV).
            return 0
        try:
            async with asyncio.timeout(spec.deadline.timeout()):
                matched = await self._prefix_lookup.matched_tokens(
                    spec.request_id, spec.prompt_token_ids, spec.cache_salt
                )
        except TimeoutError:
            raise spec.deadline.exceeded() from None
        return matched

    async def _prefill(
        self, spec: GenerationSpec
    ) -> tuple[worker_pb2.KvHandoff, list[common_pb2.TokenLogprob] | None, list[int]]:
        """The handoff (empty when EOS came first), the prompt's logprobs if asked for, and
        (prompts with images) the prompt as the engine expanded it."""
        request = worker_pb2.PrefillRequest(
            metadata=spec.metadata(),
            prompt_token_ids=spec.prompt_token_ids,
            sampling=spec.sampling,
            image_embeddings=spec.image_embeddings,
            images=spec.images,
        )
        tried: set[str] = set()
        for attempt in range(self._prefill_attempts):
            if not self._admission.serviceable("prefill", exclude=tried):
                break
            pick = _picker(self._prefill_policy, spec)
            admitted = self._admission.admit(
                "prefill", pick, exclude=frozenset(tried), deadline=spec.deadline
            )
            async with admitted as endpoint:
                tried.add(endpoint.address)
                try:
                    with metrics.STAGE_SECONDS.labels("prefill").time():
                        response = await endpoint.stub.Prefill(request, timeout=spec.deadline.grpc_timeout())
                except grpc.aio.AioRpcError as error:
                    if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and spec.deadline.expired():
                        raise spec.deadline.exceeded() from error
                    if error.code() in _RETRYABLE:
                        if error.code() in _EJECTING:
                            self._pool.request_failed(endpoint, f"prefill failed: {error.code().name}")
                        metrics.RETRIES.labels("prefill").inc()
                        log.warning(
                            "prefill failed; retrying elsewhere", address=endpoint.address, attempt=attempt
                        )
                        continue
                    raise api_error(error) from error
                self._pool.request_succeeded(endpoint)
            prompt_logprobs = (
                list(response.prompt_logprobs) if spec.sampling.HasField("prompt_logprobs") else None
            )
            expanded = list(response.prompt_token_ids)
            if not response.HasField("handoff"):
                # EOS came first: vLLM kept no KV. Decode computes the prompt itself (counted),
                # from the unexpanded prompt and the embeddings.
                return worker_pb2.KvHandoff(), prompt_logprobs, []
            return response.handoff, prompt_logprobs, expanded
        raise errors.no_workers("prefill")

    async def _generate(
        self,
        spec: GenerationSpec,
        endpoint: Endpoint,
        handoff: worker_pb2.KvHandoff | None,
        prompt_logprobs: list[common_pb2.TokenLogprob] | None = None,
    ) -> AsyncIterator[SequenceEvent | Finished]:
        request = worker_pb2.GenerateRequest(
            metadata=spec.metadata(),
            prompt_token_ids=spec.prompt_token_ids,
            sampling=spec.sampling,
        )
        if prompt_logprobs is not None:
            # The prefill worker computed them; decode, which loads the KV, does not.
            request.sampling.ClearField("prompt_logprobs")
        if handoff is not None and handoff.transport:
            request.handoff.CopyFrom(handoff)
        elif spec.has_images:
            # Computing the prompt here: this worker needs the images too.
            request.image_embeddings.extend(spec.image_embeddings)
            request.images.extend(spec.images)
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
        # A worker failing after tokens were sent hands the request on (libs/gateway/migration.py):
        # the next worker continues it with the same detokenizers and counts.
        migration = Migration(request, limit=self._migration_limit, images=spec.has_images)
        first_endpoint = endpoint
        try:
            # Holds the admission slot of each worker the request moves to, to its end.
            async with AsyncExitStack() as slots:
                while True:
                    try:
                        async with aclosing(
                            self._stream(spec, endpoint, request, progress, migration)
                        ) as events:
                            async for event in events:
                                yield event
                        return
                    except WorkerFailed as failed:
                        endpoint, request = await self._move(spec, endpoint, failed, migration, slots)
        finally:
            for detokenizer in detokenizers.values():
                detokenizer.close()
            if handoff is not None and handoff.transport and not progress.emitted:
                # The decode never consumed the handoff: free the prefill's KV now.
                await asyncio.shield(self._release(first_endpoint, spec.request_id, handoff))

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
        failed_endpoint: Endpoint,
        failure: WorkerFailed,
        migration: Migration,
        slots: AsyncExitStack,
    ) -> tuple[Endpoint, worker_pb2.GenerateRequest]:
        """The worker and request that continue a request its worker failed mid-stream
        (libs/gateway/migration.py). The new worker's admission slot is held by `slots`; waiting
        for one counts against the request's deadline like any other."""
        try:
            plan = migration.plan(failed_endpoint, str(failure), self._admission)
        except MigrationRefused as refused:
            raise MidStreamError(str(refused)) from failure
        prompt = list(plan.request.prompt_token_ids)
        endpoint = await slots.enter_async_context(
            self._admission.admit(
                plan.role,
                lambda candidates: self._decode_policy.pick(candidates, prompt),
                exclude=migration.failed,
                deadline=spec.deadline,
            )
        )
        migration.moved_to(endpoint, str(failure))
        return endpoint, plan.request

    async def _stream(
        self,
        spec: GenerationSpec,
        endpoint: Endpoint,
        request: worker_pb2.GenerateRequest,
        progress: _Progress,
        migration: Migration,
    ) -> AsyncGenerator[SequenceEvent | Finished, None]:
        """One worker's Generate stream as events. Its own failure after tokens were sent raises
        WorkerFailed (the request may move); other failures end the request."""
        call = endpoint.generate(request, spec.deadline.grpc_timeout())
        try:
            async for response in call:
                kind = response.WhichOneof("kind")
                if kind == "error":
                    engine_stopped = response.error.code == common_pb2.ERROR_CODE_OVERLOADED
                    if engine_stopped:
                        # The worker's own failure (its engine stopped), as UNAVAILABLE below.
                        self._pool.request_failed(endpoint, "generate failed: engine unavailable")
                    if not progress.emitted:
                        raise worker_error(response.error)
                    if engine_stopped:
                        raise WorkerFailed(f"decode worker failed mid-stream: {response.error.message}")
                    raise MidStreamError(response.error.message)
                self._pool.request_succeeded(endpoint)  # it generates: a half-open probe passed
                if kind == "complete":
                    usage = response.complete.usage
                    # A moved request's worker saw a longer prompt; the client's is the original.
                    prompt_tokens = len(spec.prompt_token_ids) if migration.moved else usage.prompt_tokens
                    cached = min(usage.cached_prompt_tokens, prompt_tokens)
                    if progress.prompt_logprobs is None and response.complete.prompt_logprobs:
                        progress.prompt_logprobs = list(response.complete.prompt_logprobs)
                    yield Finished(
                        prompt_tokens, progress.completion_tokens, cached, progress.prompt_logprobs
                    )
                    return
                chunk = response.chunk
                if chunk.prompt_logprobs and progress.prompt_logprobs is None:
                    progress.prompt_logprobs = list(chunk.prompt_logprobs)
                if chunk.index not in progress.open_sequences:
                    continue
                event = await self._sequence_event(spec, chunk, progress)
                if progress.prompt_logprobs is not None and chunk.index not in progress.prompt_logprobs_sent:
                    progress.prompt_logprobs_sent.add(chunk.index)
                    event.prompt_logprobs = progress.prompt_logprobs
                migration.record(chunk.index, chunk.token_ids)
                progress.emitted = True
                yield event
                if event.finish_reason is not None:
                    progress.open_sequences.discard(chunk.index)
                    if not progress.open_sequences:
                        # Stop strings ended every sequence: stop the engine now.
                        call.cancel()
                        yield Finished(
                            len(spec.prompt_token_ids),
                            progress.completion_tokens,
                            0,
                            progress.prompt_logprobs,
                        )
                        return
            failure = "the decode worker closed the stream without completing"
            raise WorkerFailed(failure) if progress.emitted else MidStreamError(failure)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and spec.deadline.expired():
                raise spec.deadline.exceeded() from error
            if error.code() in _EJECTING:
                self._pool.request_failed(endpoint, f"generate failed: {error.code().name}")
            if not progress.emitted:
                if error.code() == grpc.StatusCode.ABORTED and request.HasField("handoff"):
                    raise HandoffRejected(error.details() or "KV transfer failed") from error
                raise api_error(error) from error
            failure = f"decode worker failed mid-stream: {error.code().name}"
            raise (WorkerFailed if error.code() in MIGRATING_CODES else MidStreamError)(failure) from error
        finally:
            call.cancel()

    @staticmethod
    async def _sequence_event(
        spec: GenerationSpec, chunk: worker_pb2.TokenChunk, progress: _Progress
    ) -> SequenceEvent:
        """One chunk's text (stop strings applied), finish and stop reason."""
        detokenizer = progress.detokenizers[chunk.index]
        shown = list(chunk.token_ids)
        stop_token = chunk.stop_token_id if chunk.HasField("stop_token_id") else None
        if stop_token is not None and shown and not spec.include_stop_str_in_output:
            shown = shown[:-1]  # vLLM leaves a stop token's text out unless asked
        detokenized = await detokenizer.feed(shown)
        text = detokenized.text
        progress.completion_tokens += len(chunk.token_ids)
        finish = _FINISH.get(chunk.finish_reason)
        stop_reason: int | str | None = stop_token
        if detokenized.stopped:
            finish, stop_reason = "stop", detokenized.matched_stop
        elif finish is not None:
            text += (await detokenizer.finish()).text
        return SequenceEvent(
            chunk.index, text, list(chunk.token_ids), list(chunk.logprobs), finish, stop_reason
        )

    async def _release(self, endpoint: Endpoint, request_id: str, handoff: worker_pb2.KvHandoff) -> None:
        try:
            await endpoint.stub.ReleaseKv(
                worker_pb2.ReleaseKvRequest(request_id=request_id, handoff=handoff), timeout=5
            )
        except grpc.aio.AioRpcError as error:
            log.warning("could not release prefill KV; its lease will expire", code=error.code().name)


def _picker(
    policy: RoutingPolicy, spec: GenerationSpec, estimate: PrefixEstimate | None = None
) -> Callable[[Sequence[Endpoint]], Endpoint]:
    """The policy's choice for this request among the workers admission control offers;
    `estimate` reads the policy's cached-prefix guesses first (the pick records this prompt)."""

    def pick(candidates: Sequence[Endpoint]) -> Endpoint:
        if estimate is not None:
            estimate.observe(candidates, spec.prompt_token_ids)
        return policy.pick(candidates, spec.prompt_token_ids)

    return pick
