"""Request migration: when the worker generating a request fails mid-stream, the request
continues on another decode (or colocated) worker from what it already generated, as NVIDIA
Dynamo's frontend does (its `--migration-limit`, the same flag here).

The continuation is the original Generate request with the tokens generated so far appended
to the prompt and the token budget reduced by them (`continuation_request`). It carries no KV
handoff: the new worker computes the longer prompt itself (or loads its stored prefix, when
the workers use a kvstore). The pipeline keeps the sequence's detokenize stream, token count
and logprobs across the move, so the client's stream goes on with no token repeated or
missing, and the usage it reports keeps the original prompt's length. The new worker is
chosen as any request's is, through admission control (libs/gateway/fleet/admission.py), among the
decode workers (colocated ones when no decode worker is left) that have not failed this request;
its slot is held to the request's end, and a wait for one counts against the request's deadline.

What carries over, and what cannot:
- Greedy decoding continues with the tokens the uninterrupted run would have produced (up to
  floating point: the moved tokens' KV is computed in one prefill batch instead of one decode
  step at a time; identical in float32 in tests/e2e/test_migration.py).
- Random sampling continues with new draws: a seed is kept, but the continuation's random
  stream starts over, so a seeded request is reproducible only up to where it moved.
- vLLM's presence/frequency penalties count generated tokens only, so a request with them
  moves as n > 1 does (GenerateRequest.sequences): the worker counts the tokens sent before
  the move as output for its penalties (libs/worker/vllm_moved_penalties.py), and greedy
  output is the uninterrupted run's. A worker that speculates cannot (vLLM takes no custom
  logits processor then): there the earlier tokens are prompt and are no longer penalized.
- Structured output moves as n > 1 does (GenerateRequest.sequences, here one sequence): the
  worker starts the request's grammar after the tokens already sent (vLLM cannot, so its
  scheduler gets a hook for it: libs/worker/vllm_grammar_prefix.py), so greedy output is the
  uninterrupted run's and the document stays valid. The mock engine refuses it.
- n > 1 moves as one request (`sequences_request`): the worker runs each sequence still open
  from the prompt plus that sequence's tokens, its budget less them, under its own index
  (GenerateRequest.sequences), so the client's stream goes on for every sequence and the
  finished ones stay finished. vLLM takes n > 1 only sampled: each sequence continues as a
  valid sample with new draws (a seed gives each sequence vLLM's seed for it, seed + index,
  from the cut on).
- Only the worker's own failures migrate: its process or connection gone (UNAVAILABLE), the
  stream ended without its complete message, its engine stopped (ERROR_CODE_OVERLOADED). A
  request the worker refuses, or an internal error that may be this request's own, is not
  retried elsewhere.
- Before the first token the same failures move the request too, and every request can move
  then (n > 1 and structured output included): nothing reached the client, so the new worker
  simply runs the original request, prompt logprobs included, without the KV handoff (its
  KV is released on the prefill worker; the new worker computes the prompt). A KV handoff the
  decode worker refused is prefilled again, as before (generate.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import grpc
import structlog

from cleave.worker.v1 import worker_pb2
from libs.config.roles import Role
from libs.gateway.common import metrics
from libs.gateway.fleet.admission import Admission
from libs.gateway.fleet.pool import Endpoint

log = structlog.get_logger(__name__)

# gRPC codes of a generating worker's own failure, on which the request moves. Any other code
# after the first token (INTERNAL, DEADLINE_EXCEEDED, ...) ends the request as before.
MIGRATING_CODES = frozenset({grpc.StatusCode.UNAVAILABLE})
DEFAULT_LIMIT = 2


class WorkerFailed(Exception):
    """The generating worker's own failure after the client got tokens: the request may move."""


class MigrationRefused(Exception):
    """The request cannot continue elsewhere; the message says what failed and why."""


@dataclass(frozen=True)
class Plan:
    role: Role  # DECODE or BOTH: admission control picks the worker (it waits for room)
    request: worker_pb2.GenerateRequest


def continuation_request(
    original: worker_pb2.GenerateRequest, generated: Sequence[int]
) -> worker_pb2.GenerateRequest:
    """The request that generates the rest of a single sequence: prompt + what was generated,
    max_tokens and min_tokens less what was generated, no handoff, no prompt logprobs once
    tokens were generated (the client asked for the original prompt's, and the extended
    prompt's are not those). With nothing generated: the original request, less its handoff."""
    request = worker_pb2.GenerateRequest()
    request.CopyFrom(original)
    request.ClearField("handoff")
    if not generated:
        return request
    request.prompt_token_ids.extend(generated)
    sampling = request.sampling
    if sampling.HasField("max_tokens"):
        sampling.max_tokens -= len(generated)
    sampling.min_tokens = max(0, sampling.min_tokens - len(generated))
    sampling.ClearField("prompt_logprobs")
    return request


def sequences_request(
    original: worker_pb2.GenerateRequest, generated: Mapping[int, Sequence[int]]
) -> worker_pb2.GenerateRequest:
    """The request that generates the rest of an n > 1 request's open sequences (`generated`:
    each one's tokens so far, by index): the original less its handoff and prompt logprobs,
    with one GenerateRequest.sequences entry per open sequence (the worker shortens each
    budget)."""
    request = worker_pb2.GenerateRequest()
    request.CopyFrom(original)
    request.ClearField("handoff")
    request.sampling.ClearField("prompt_logprobs")
    del request.sequences[:]
    for index, tokens in sorted(generated.items()):
        request.sequences.add(index=index, token_ids=tokens)
    return request


class Migration:
    """One request's migrations: the tokens it generated so far, the workers that failed it,
    and how many times it moved (at most `limit`; 0 disables migration)."""

    def __init__(self, original: worker_pb2.GenerateRequest, *, limit: int, images: bool = False) -> None:
        self._original = original
        self._limit = limit
        # A prompt with images whose KV came from a prefill worker: the request holds the
        # expanded prompt and no embeddings, so another worker could not recompute it.
        self._images = (
            images and original.HasField("handoff") and not (original.image_embeddings or original.images)
        )
        self._generated: dict[int, list[int]] = {}  # by sequence index
        self.sent = False  # the client got tokens (of any sequence)
        self._failed: set[str] = set()
        self.migrations = 0

    @property
    def moved(self) -> bool:
        return self.migrations > 0

    def record(self, index: int, token_ids: Sequence[int]) -> None:
        """Tokens the client was sent for sequence `index`."""
        self.sent = self.sent or bool(token_ids)
        self._generated.setdefault(index, []).extend(token_ids)

    @property
    def failed(self) -> frozenset[str]:
        """Addresses of the workers that failed this request; it does not go back to them."""
        return frozenset(self._failed)

    def plan(
        self, failed: Endpoint, failure: str, admission: Admission, open_sequences: Iterable[int] = (0,)
    ) -> Plan:
        """The role of the worker to continue on and the continuation request, after `failed`
        failed the request with `failure` while `open_sequences` had not finished; raises
        MigrationRefused (counted) when it cannot move."""
        self._failed.add(failed.address)
        still_open = sorted(open_sequences)
        refusal = self._refusal(still_open)
        # Decode workers first (generating is their job); colocated ones when none is left.
        roles = [r for r in (Role.DECODE, Role.BOTH) if admission.serviceable(r, exclude=self._failed)]
        if refusal is None and not roles:
            refusal = "no_worker", "no other healthy decode or colocated worker"
        if refusal is not None:
            reason, why = refusal
            metrics.MIGRATIONS_REFUSED.labels(reason).inc()
            raise MigrationRefused(f"{failure}; not continued on another worker: {why}")
        sampling = self._original.sampling
        structured = sampling.structured_output.WhichOneof("kind") is not None
        penalized = sampling.presence_penalty != 0 or sampling.frequency_penalty != 0
        if ((sampling.n or 1) > 1 or structured or penalized) and self.sent:
            # The worker needs each sequence's tokens apart from the prompt: to run them as
            # several sequences, to start a grammar after them, and to penalize them as output.
            return Plan(
                roles[0],
                sequences_request(self._original, {i: self._generated.get(i, []) for i in still_open}),
            )
        return Plan(roles[0], continuation_request(self._original, self._generated.get(0, [])))

    def moved_to(self, endpoint: Endpoint, failure: str) -> None:
        """The continuation was sent to `endpoint`: counted and logged."""
        self.migrations += 1
        metrics.MIGRATIONS.inc()
        log.warning(
            "continuing the request on another worker",
            request_id=self._original.metadata.request_id,
            failed=sorted(self._failed),
            failure=failure,
            to=endpoint.address,
            generated_tokens=sum(len(tokens) for tokens in self._generated.values()),
            migration=self.migrations,
        )

    def _refusal(self, still_open: Sequence[int] = (0,)) -> tuple[str, str] | None:
        """(metric label, reason) when the request cannot move at all."""
        sampling = self._original.sampling
        if self._limit == 0:
            return "disabled", "migration is disabled (--migration-limit 0)"
        if self.migrations >= self._limit:
            return "limit", f"it already moved {self.migrations} time(s) (--migration-limit {self._limit})"
        if self._images:
            return "images", "requests with images prefilled elsewhere are not migrated"
        if not self.sent:
            return None  # nothing reached the client: the request runs again from its start
        longest = max((len(self._generated.get(i, ())) for i in still_open), default=0)
        if sampling.HasField("max_tokens") and longest >= sampling.max_tokens:
            # The worker sent every token but not the finish: nothing is left to generate.
            return "nothing_left", "all max_tokens were generated but the sequence never finished"
        return None
