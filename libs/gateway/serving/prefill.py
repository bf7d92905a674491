"""A prompt computed on a prefill worker, retried on another when a worker fails by its own fault.

Fault attribution: a request a worker refuses as invalid (INVALID_ARGUMENT) is the client's
mistake, answered 400 with the worker's message; it is never retried and never ejects the
worker. UNAVAILABLE (unreachable, engine not running) ejects the worker and retries;
INTERNAL may be this request's alone and DEADLINE_EXCEEDED may be a busy machine, so those
retry elsewhere without ejecting (the stats poller judges those workers). A worker at its
bound on running requests refuses before running anything: not a failure, and not an attempt;
the request waits for room (libs/gateway/fleet/admission.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import grpc.aio
import structlog

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2
from libs.config.roles import Role
from libs.gateway.common import errors, metrics
from libs.gateway.common.generation import GenerationSpec
from libs.gateway.fleet.admission import Admission, Pick, Slot
from libs.gateway.fleet.pool import WorkerPool
from libs.gateway.fleet.routing import RoutingPolicy
from libs.gateway.serving.lifecycle import Phase, RequestLife
from libs.gateway.serving.picking import picker
from libs.gateway.serving.worker_errors import api_error
from libs.rpc import at_capacity

log = structlog.get_logger(__name__)

_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL}
_EJECTING = {grpc.StatusCode.UNAVAILABLE}


@dataclass(frozen=True)
class Prefilled:
    # Where the decode worker pulls the prompt's KV from; None when the first token already
    # ended the request (EOS) and vLLM kept no KV: the decode worker computes the prompt.
    handoff: worker_pb2.KvHandoff | None
    prompt_logprobs: list[common_pb2.TokenLogprob] | None  # when the spec asked for them
    # Prompts with images: the prompt as the engine ran it (placeholders expanded to one token
    # per embedding), which is the decode worker's prompt; empty otherwise.
    expanded_prompt: list[int]


class Prefill:
    def __init__(
        self, pool: WorkerPool, admission: Admission, policy: RoutingPolicy, *, attempts: int = 2
    ) -> None:
        self._pool = pool
        self._admission = admission
        self._policy = policy
        self._attempts = attempts

    async def run(self, spec: GenerationSpec, life: RequestLife) -> Prefilled:
        """Prefills on up to `attempts` workers (each retry a PREFILLING -> PREFILLING step)."""
        request = worker_pb2.PrefillRequest(
            metadata=spec.metadata(),
            prompt_token_ids=spec.prompt_token_ids,
            sampling=spec.sampling,
            image_embeddings=spec.image_embeddings,
            images=spec.images,
        )
        tried: set[str] = set()
        failure: grpc.aio.AioRpcError | None = None
        pick = picker(self._policy, spec)
        for attempt in range(self._attempts):
            if not self._admission.serviceable(Role.PREFILL, exclude=tried):
                break
            if attempt > 0:
                metrics.RETRIES.labels("prefill").inc()
                await life.to(Phase.PREFILLING, why="retry on another prefill worker")
            admitted = self._admission.admit(
                Role.PREFILL, pick, exclude=frozenset(tried), deadline=spec.deadline
            )
            async with admitted as slot:
                try:
                    response = await self._prefill_on(slot, request, spec, pick, tried)
                except grpc.aio.AioRpcError as error:
                    if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and spec.deadline.expired():
                        raise spec.deadline.exceeded() from error
                    if error.code() not in _RETRYABLE:
                        raise api_error(error) from error
                    if error.code() in _EJECTING and slot.endpoint is not None:
                        self._pool.request_failed(slot.endpoint, f"prefill failed: {error.code().name}")
                    failure = error
                    log.warning(
                        "prefill failed",
                        address=slot.endpoint.address if slot.endpoint is not None else None,
                        attempt=attempt,
                        code=error.code().name,
                        details=error.details(),
                    )
                    continue
            return _prefilled(spec, response)
        # No worker left to try: the client hears why the last one failed, not that none was
        # healthy (the only prefill worker failing this request says nothing of the others).
        raise errors.no_workers(Role.PREFILL) if failure is None else api_error(failure)

    async def _prefill_on(
        self,
        slot: Slot,
        request: worker_pb2.PrefillRequest,
        spec: GenerationSpec,
        pick: Pick,
        tried: set[str],
    ) -> worker_pb2.PrefillResponse:
        """The slot's worker's prefill; a worker at its bound (another gateway filled it since
        it last reported) refuses before running anything, and the request waits, at the head
        of the queue, for the next worker with room, that one included."""
        while True:
            endpoint = slot.endpoint
            assert endpoint is not None  # held for the admit block; `move` refills it
            tried.add(endpoint.address)
            try:
                with metrics.STAGE_SECONDS.labels("prefill").time():
                    response = await endpoint.stub.Prefill(request, timeout=spec.deadline.grpc_timeout())
            except grpc.aio.AioRpcError as error:
                if not at_capacity.is_at_capacity(error.code(), error.details()):
                    raise
                endpoint.refused_at_capacity()
                tried.discard(endpoint.address)
                metrics.RETRIES.labels("at_capacity").inc()
                await self._admission.move(slot, pick, exclude=frozenset(tried), deadline=spec.deadline)
                continue
            self._pool.request_succeeded(endpoint)
            return response


def _prefilled(spec: GenerationSpec, response: worker_pb2.PrefillResponse) -> Prefilled:
    prompt_logprobs = list(response.prompt_logprobs) if spec.sampling.HasField("prompt_logprobs") else None
    if not response.HasField("handoff"):
        # EOS came first: vLLM kept no KV. Decode computes the prompt itself (counted), from
        # the unexpanded prompt and the embeddings.
        return Prefilled(None, prompt_logprobs, [])
    return Prefilled(response.handoff, prompt_logprobs, list(response.prompt_token_ids))
