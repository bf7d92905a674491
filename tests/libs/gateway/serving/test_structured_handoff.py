"""Structured output across the P/D handoff, with in-memory workers: the prefill worker and the
decode worker both get the request's constraint and the same prompt, so each engine's grammar
starts at the first generated token; the client's tokens are all the decode worker's (the
prefill's first token is not prepended, which would put decode's grammar one token behind).
A worker's INVALID_ARGUMENT about a constraint is a 400 that opens no breaker."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2
from libs.gateway.common import errors
from libs.gateway.common.generation import GenerationSpec, SequenceEvent
from libs.gateway.fleet.pool import WorkerPool
from libs.gateway.fleet.routing import create_policy
from libs.gateway.serving.generate import Serving
from tests.libs.gateway.fake_workers import TOKENS, FakeDetokenizer, FakeWorker, fake_pool, rpc_error

pytestmark = pytest.mark.anyio

CONSTRAINT = common_pb2.StructuredOutput(json_schema='{"type": "object"}', disable_any_whitespace=True)


class RecordingWorker(FakeWorker):
    def __init__(self, refuse: str | None = None) -> None:
        super().__init__()
        self.refuse = refuse
        self.prefills: list[worker_pb2.PrefillRequest] = []
        self.generates: list[worker_pb2.GenerateRequest] = []

    async def Prefill(self, request: worker_pb2.PrefillRequest, **options: Any) -> worker_pb2.PrefillResponse:
        self.prefills.append(request)
        if self.refuse:
            raise rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.refuse)
        return await super().Prefill(request, **options)

    def Generate(self, request: worker_pb2.GenerateRequest, *, timeout: float | None = None) -> Any:
        self.generates.append(request)
        return super().Generate(request, timeout=timeout)


def spec() -> GenerationSpec:
    sampling = common_pb2.SamplingParams(max_tokens=8, structured_output=CONSTRAINT)
    return GenerationSpec("r", "m", [1, 2, 3], sampling, [])


def pipeline(pool: WorkerPool) -> Serving:
    policy = create_policy("round_robin")
    return Serving(pool, FakeDetokenizer(), policy, policy)  # type: ignore[arg-type]


async def test_both_workers_get_the_constraint_and_the_same_prompt() -> None:
    prefill, decode = RecordingWorker(), RecordingWorker()
    pool = await fake_pool({"prefill": [prefill], "decode": [decode]})
    tokens = [
        t
        for e in [e async for e in pipeline(pool).generate(spec())]
        if isinstance(e, SequenceEvent)
        for t in e.token_ids
    ]
    [prefilled], [generated] = prefill.prefills, decode.generates
    assert prefilled.sampling.structured_output == generated.sampling.structured_output == CONSTRAINT
    assert list(prefilled.prompt_token_ids) == list(generated.prompt_token_ids) == [1, 2, 3]
    assert generated.HasField("handoff")
    assert tokens == list(TOKENS)  # every token the client gets is decode's, none from prefill


async def test_a_refused_constraint_is_a_400_that_blames_no_worker() -> None:
    prefill, decode = RecordingWorker(refuse="Invalid regex: unterminated group"), RecordingWorker()
    pool = await fake_pool({"prefill": [prefill], "decode": [decode]})
    for _ in range(4):  # more than the breaker's failure streak
        with pytest.raises(errors.ApiError, match="Invalid regex") as raised:
            async for _event in pipeline(pool).generate(spec()):
                pass
        assert raised.value.status == 400
    assert len(prefill.prefills) == 4  # never retried elsewhere, never ejected
    assert all(endpoint.healthy for endpoint in pool.endpoints)
