"""A request's life (libs/gateway/serving/lifecycle.py): every transition of the table, the KV
release its transitions carry, and a failure injected in each phase through the serving room
over in-memory workers that keep a ledger of KV: each phase's failure ends in its documented
outcome (a retry, a migration or a typed error), and no KV is left held, leased or running."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2
from libs.gateway.common import errors
from libs.gateway.common.errors import MidStreamError
from libs.gateway.common.generation import GenerationSpec, SequenceEvent
from libs.gateway.fleet.admission import Admission, AdmissionConfig
from libs.gateway.fleet.breaker import BreakerConfig
from libs.gateway.fleet.routing import create_policy
from libs.gateway.serving.generate import Serving
from libs.gateway.serving.lifecycle import TRANSITIONS, IllegalTransition, Phase, RequestLife
from tests.libs.gateway.fake_workers import FakeDetokenizer, fake_pool, rpc_error

pytestmark = pytest.mark.anyio

# -- the table --------------------------------------------------------------------------------


async def reach(phase: Phase, released: list[str]) -> RequestLife:
    """A life brought to `phase` along allowed transitions."""

    async def release() -> None:
        released.append("kv")

    life = RequestLife("r")
    path = {
        Phase.PLANNED: [],
        Phase.PREFILLING: [Phase.PREFILLING],
        Phase.HANDED_OFF: [Phase.PREFILLING, Phase.HANDED_OFF],
        Phase.DECODING: [Phase.DECODING],
        Phase.STREAMING: [Phase.DECODING, Phase.STREAMING],
        Phase.MIGRATING: [Phase.DECODING, Phase.STREAMING, Phase.MIGRATING],
        Phase.DONE: [Phase.DECODING, Phase.DONE],
        Phase.FAILED: [Phase.FAILED],
    }[phase]
    for step in path:
        await life.to(step, release=release if step is Phase.HANDED_OFF else None)
    return life


@pytest.mark.parametrize(("source", "target"), list(itertools.product(Phase, Phase)))
async def test_every_pair_of_phases_is_allowed_exactly_as_the_table_says(
    source: Phase, target: Phase
) -> None:
    released: list[str] = []
    life = await reach(source, released)
    release_now: list[str] = []

    async def release() -> None:
        release_now.append("kv")

    if target in TRANSITIONS[source]:
        await life.to(target, release=release if target is Phase.HANDED_OFF else None)
        assert life.phase is target and life.path[-1] is target
        # Leaving HANDED_OFF for anything but DECODING frees the handoff's KV.
        expected = ["kv"] if source is Phase.HANDED_OFF and target is not Phase.DECODING else []
        assert released == expected
    else:
        with pytest.raises(IllegalTransition):
            await life.to(target, release=release)
        assert life.phase is source


async def test_terminal_phases_go_nowhere_and_failing_twice_is_one_failure() -> None:
    released: list[str] = []
    life = await reach(Phase.HANDED_OFF, released)
    await life.fail("client went away")
    await life.fail("and again")
    assert (life.phase, life.why, released) == (Phase.FAILED, "client went away", ["kv"])
    assert TRANSITIONS[Phase.DONE] == TRANSITIONS[Phase.FAILED] == frozenset()


async def test_a_handoff_needs_a_way_to_release_it_and_a_rejection_needs_a_handoff() -> None:
    life = await reach(Phase.PREFILLING, [])
    with pytest.raises(IllegalTransition):
        await life.to(Phase.HANDED_OFF)
    with pytest.raises(IllegalTransition):
        life.handoff_rejected("lease expired")


async def test_a_rejected_handoff_stays_handed_off_until_prefilled_again() -> None:
    released: list[str] = []
    life = await reach(Phase.HANDED_OFF, released)
    life.handoff_rejected("lease expired")
    assert (life.phase, life.why, released) == (Phase.HANDED_OFF, "lease expired", [])
    await life.to(Phase.PREFILLING)
    assert released == ["kv"]


async def test_a_consumed_handoff_is_never_released() -> None:
    released: list[str] = []
    life = await reach(Phase.HANDED_OFF, released)
    for phase in (Phase.DECODING, Phase.STREAMING, Phase.FAILED):
        await life.to(phase)
    assert released == []
    assert life.sent_tokens is False  # FAILED
    assert (await reach(Phase.MIGRATING, [])).sent_tokens


# -- failures injected in each phase, through the serving room --------------------------------


@dataclass
class Ledger:
    """The fleet's KV as the fake workers keep it: prompts leased by prefill for a handoff, and
    Generate streams running (each holds its request's KV until it ends or is cancelled)."""

    leased: set[str] = field(default_factory=set)
    running: int = 0
    released: list[str] = field(default_factory=list)

    def clean(self) -> bool:
        return not self.leased and self.running == 0


class _Call:
    """A Generate call: its stream holds the request's KV on the worker until it completes,
    fails or is cancelled (as a real worker aborts a cancelled request in its engine)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.ended = False
        ledger.running += 1
        self.responses: AsyncIterator[worker_pb2.GenerateResponse] | None = None

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self.ledger.running -= 1

    def __aiter__(self) -> AsyncIterator[worker_pb2.GenerateResponse]:
        assert self.responses is not None
        return self.responses

    def cancel(self) -> bool:
        self.end()
        return True


class LedgerWorker:
    """A worker stub whose calls follow a script: `prefill` is a list of outcomes for its
    Prefill calls (None: answer; a status code: fail), `generate` one for its Generate calls
    ("ok"; ("before", code): fail before any token; ("after", code): fail after one chunk;
    "hold": never answer)."""

    def __init__(
        self, ledger: Ledger, *, prefill: list[Any] | None = None, generate: list[Any] | None = None
    ):
        self.ledger = ledger
        self.prefill_script = list(prefill or [])
        self.generate_script = list(generate or [])
        self.prefills = 0
        self.generates = 0
        self.holding = asyncio.Event()

    async def Prefill(self, request: worker_pb2.PrefillRequest, **_: Any) -> worker_pb2.PrefillResponse:
        self.prefills += 1
        outcome = self.prefill_script.pop(0) if self.prefill_script else None
        if outcome is not None:
            raise rpc_error(outcome, "prefill failed")
        lease = f"{request.metadata.request_id}#{self.prefills}"
        self.ledger.leased.add(lease)
        handoff = worker_pb2.KvHandoff(transport="nixl", remote_request_id=lease, num_tokens=3)
        return worker_pb2.PrefillResponse(handoff=handoff)

    def Generate(self, request: worker_pb2.GenerateRequest, **_: Any) -> _Call:
        self.generates += 1
        outcome = self.generate_script.pop(0) if self.generate_script else "ok"
        call = _Call(self.ledger)
        call.responses = self._stream(request, outcome, call)
        return call

    async def _stream(
        self, request: worker_pb2.GenerateRequest, outcome: Any, call: _Call
    ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        try:
            if outcome == "hold":
                self.holding.set()
                await asyncio.Event().wait()
            if isinstance(outcome, tuple) and outcome[0] == "before":
                raise rpc_error(outcome[1], "decode failed")
            lease = request.handoff.remote_request_id if request.HasField("handoff") else ""
            self.ledger.leased.discard(lease)  # the decode worker pulled the KV: prefill frees it
            yield worker_pb2.GenerateResponse(chunk=worker_pb2.TokenChunk(token_ids=[3]))
            if isinstance(outcome, tuple) and outcome[0] == "after":
                raise rpc_error(outcome[1], "decode died")
            yield worker_pb2.GenerateResponse(
                chunk=worker_pb2.TokenChunk(token_ids=[4], finish_reason=common_pb2.FINISH_REASON_LENGTH)
            )
            usage = common_pb2.Usage(prompt_tokens=len(request.prompt_token_ids), completion_tokens=2)
            call.end()  # finished in the engine: its KV belongs to the prefix cache now
            yield worker_pb2.GenerateResponse(complete=worker_pb2.GenerateComplete(usage=usage))
        except BaseException:
            call.end()
            raise

    async def ReleaseKv(self, request: worker_pb2.ReleaseKvRequest, **_: Any) -> worker_pb2.ReleaseKvResponse:
        # Served by decode workers; vLLM frees the prefill engine's blocks over its own channel.
        self.ledger.leased.discard(request.handoff.remote_request_id)
        self.ledger.released.append(request.request_id)
        return worker_pb2.ReleaseKvResponse()

    async def GetStats(self, request: Any, **_: Any) -> worker_pb2.WorkerStats:
        return worker_pb2.WorkerStats()

    async def GetInfo(self, request: Any, **_: Any) -> worker_pb2.WorkerInfo:
        return worker_pb2.WorkerInfo(vocab_size=100, max_model_len=2048, max_num_seqs=8)


def phases_entered() -> dict[str, float]:
    return {
        phase.value: REGISTRY.get_sample_value("cleave_gateway_request_phase_total", {"phase": phase.value})
        or 0.0
        for phase in Phase
    }


class Request:
    """One request through a serving room over `roles`; `entered` counts the phases it entered
    (read from the phase metric, whatever way the request ended)."""

    def __init__(self, roles: dict[str, list[LedgerWorker]], *, migration_limit: int = 2, **admission: Any):
        self.roles = roles
        self.migration_limit = migration_limit
        self.admission = admission
        self.entered: dict[str, float] = {}

    async def serving(self) -> Serving:
        pool = await fake_pool(self.roles, breaker=BreakerConfig(failures_to_open=1))
        return Serving(
            pool,
            FakeDetokenizer(),  # type: ignore[arg-type]
            create_policy("round_robin"),
            create_policy("round_robin"),
            admission=Admission(pool, AdmissionConfig(**self.admission)),
            migration_limit=self.migration_limit,
        )

    async def run(self, serving: Serving | None = None) -> str:
        serving = serving or await self.serving()
        before = phases_entered()
        spec = GenerationSpec("r", "m", [1, 2, 3], common_pb2.SamplingParams(max_tokens=8), [])
        text = ""
        try:
            async for event in serving.generate(spec):
                if isinstance(event, SequenceEvent):
                    text += event.text
        finally:
            after = phases_entered()
            self.entered = {
                phase: after[phase] - before[phase] for phase in after if after[phase] > before[phase]
            }
        return text


async def test_planned_without_a_decode_worker_is_a_503_and_holds_nothing() -> None:
    ledger = Ledger()
    prefill = LedgerWorker(ledger)
    with pytest.raises(errors.ApiError) as raised:
        await Request({"prefill": [prefill]}).run()
    assert raised.value.status == 503 and prefill.prefills == 0
    assert ledger.clean()


async def test_planned_with_a_full_queue_is_a_429() -> None:
    ledger = Ledger()
    decode = LedgerWorker(ledger, generate=["hold"])
    prefill = LedgerWorker(ledger)
    request = Request(
        {"prefill": [prefill], "decode": [decode]}, max_inflight_per_worker=1, max_queued_requests=0
    )
    serving = await request.serving()
    first = asyncio.create_task(request.run(serving))
    await decode.holding.wait()
    with pytest.raises(errors.ApiError) as raised:
        await request.run(serving)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert raised.value.status == 429
    assert ledger.clean()  # the cancelled first request released its handoff and its stream


async def test_prefilling_retries_on_another_worker_after_a_workers_own_failure() -> None:
    ledger = Ledger()
    dead, alive = LedgerWorker(ledger, prefill=[grpc.StatusCode.UNAVAILABLE]), LedgerWorker(ledger)
    decode = LedgerWorker(ledger)
    request = Request({"prefill": [dead, alive], "decode": [decode]})
    text = await request.run()
    entered = request.entered
    assert text == "<3><4>"
    assert (dead.prefills, alive.prefills) == (1, 1)
    assert entered["prefilling"] == 2 and entered["done"] == 1
    assert ledger.clean()


async def test_prefilling_refused_as_invalid_is_a_400_without_a_retry() -> None:
    ledger = Ledger()
    first, second = LedgerWorker(ledger, prefill=[grpc.StatusCode.INVALID_ARGUMENT]), LedgerWorker(ledger)
    request = Request({"prefill": [first, second], "decode": [LedgerWorker(ledger)]})
    with pytest.raises(errors.ApiError) as raised:
        await request.run()
    assert raised.value.status == 400 and first.prefills + second.prefills == 1
    assert request.entered["failed"] == 1
    assert ledger.clean()


async def test_handed_off_and_rejected_releases_the_kv_and_prefills_again() -> None:
    ledger = Ledger()
    prefill = LedgerWorker(ledger)
    decode = LedgerWorker(ledger, generate=[("before", grpc.StatusCode.ABORTED)])
    request = Request({"prefill": [prefill], "decode": [decode]})
    text = await request.run()
    entered = request.entered
    assert text == "<3><4>" and prefill.prefills == 2
    assert ledger.released == ["r"]  # the first handoff, released before the second prefill
    assert entered["handed_off"] == 2 and entered["prefilling"] == 2
    assert ledger.clean()


async def test_handed_off_and_rejected_twice_is_a_503_with_both_handoffs_released() -> None:
    ledger = Ledger()
    aborted = ("before", grpc.StatusCode.ABORTED)
    decode = LedgerWorker(ledger, generate=[aborted, aborted])
    request = Request({"prefill": [LedgerWorker(ledger)], "decode": [decode]})
    with pytest.raises(errors.ApiError, match="KV handoff failed twice") as raised:
        await request.run()
    assert raised.value.status == 503 and ledger.released == ["r", "r"]
    assert ledger.clean()


async def test_handed_off_when_the_decode_worker_dies_is_a_503_with_the_kv_released() -> None:
    ledger = Ledger()
    decode = LedgerWorker(ledger, generate=[("before", grpc.StatusCode.UNAVAILABLE)])
    request = Request({"prefill": [LedgerWorker(ledger)], "decode": [decode]})
    with pytest.raises(errors.ApiError) as raised:
        await request.run()
    assert raised.value.status == 503 and ledger.released == ["r"]
    assert ledger.clean()


async def test_handed_off_when_the_client_goes_away_releases_the_kv() -> None:
    ledger = Ledger()
    decode = LedgerWorker(ledger, generate=["hold"])
    request = Request({"prefill": [LedgerWorker(ledger)], "decode": [decode]})
    task = asyncio.create_task(request.run())
    await decode.holding.wait()
    assert ledger.leased  # prefilled, handed off, not pulled yet
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ledger.released == ["r"] and request.entered["failed"] == 1
    assert ledger.clean()


async def test_decoding_on_a_colocated_worker_that_fails_before_a_token_is_a_typed_error() -> None:
    ledger = Ledger()
    both = LedgerWorker(ledger, generate=[("before", grpc.StatusCode.UNAVAILABLE)])
    request = Request({"both": [both]})
    with pytest.raises(errors.ApiError) as raised:
        await request.run()
    assert raised.value.status == 503 and request.entered["decoding"] == 1
    assert ledger.clean()


async def test_streaming_when_the_worker_dies_migrates_to_another() -> None:
    ledger = Ledger()
    dying = LedgerWorker(ledger, generate=[("after", grpc.StatusCode.UNAVAILABLE)])
    other = LedgerWorker(ledger)
    request = Request({"prefill": [LedgerWorker(ledger)], "decode": [dying, other]})
    text = await request.run()
    entered = request.entered
    assert text == "<3><3><4>"  # one token before the failure, then the continuation's
    assert entered["migrating"] == 1 and entered["streaming"] == 2 and entered["done"] == 1
    assert other.generates == 1
    assert ledger.clean()


async def test_streaming_with_an_error_that_is_not_the_workers_own_is_a_mid_stream_error() -> None:
    ledger = Ledger()
    decode = LedgerWorker(ledger, generate=[("after", grpc.StatusCode.INTERNAL)])
    request = Request({"prefill": [LedgerWorker(ledger)], "decode": [decode, LedgerWorker(ledger)]})
    with pytest.raises(MidStreamError, match="INTERNAL"):
        await request.run()
    assert "migrating" not in request.entered
    assert ledger.clean()


async def test_migrating_that_cannot_move_is_a_mid_stream_error() -> None:
    ledger = Ledger()
    decode = LedgerWorker(ledger, generate=[("after", grpc.StatusCode.UNAVAILABLE)])
    request = Request({"prefill": [LedgerWorker(ledger)], "decode": [decode]}, migration_limit=0)
    with pytest.raises(MidStreamError, match="migration is disabled"):
        await request.run()
    assert request.entered["migrating"] == 1 and request.entered["failed"] == 1
    assert ledger.clean()
