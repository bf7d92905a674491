"""Fuzzing the worker's gRPC servicer (prefill, decode and colocated roles) on the fake
engine: arbitrary messages (any field set or not, any value of its wire type, ids outside
the vocabulary, NaN and infinite sampling values, random handoffs and layouts) never end as
UNKNOWN, INTERNAL or UNAVAILABLE, which the gateway would count against the worker and
eject it for; a Generate stream that started ends with exactly one complete or a typed error
that is not INTERNAL; nothing is left running on the engine; the worker still answers."""

from __future__ import annotations

import math
from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2 as pb
from cleave.worker.v1 import worker_pb2_grpc
from libs.config.roles import Role
from libs.worker.config import WorkerConfig
from libs.worker.layout import kv_layout
from libs.worker.service import WorkerService
from services.worker.servicer import WorkerServicer, binding
from tests.fuzz.calls import Caller
from tests.fuzz.events import outcome
from tests.fuzz.protos import messages
from tests.fuzz.servers import background_server
from tests.libs.worker.fake_engine import INFO, FakeEngine

VOCAB = INFO.vocab_size
MODEL = "fake"
# ABORTED: a handoff this worker cannot use (lease expired); the gateway prefills again.
REFUSALS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.ABORTED,
}
STREAM_ERRORS = {common_pb2.ERROR_CODE_INVALID_ARGUMENT, common_pb2.ERROR_CODE_ABORTED}
TIMEOUT_S = 30
CALLER = Caller(REFUSALS, TIMEOUT_S)
unary = CALLER.unary
check_refusal = CALLER.refused

FUZZ = settings(
    max_examples=200,
    deadline=None,
    database=None,  # no .hypothesis/ folder written into the checkout
    derandomize=True,  # the same examples every run: a CI failure reproduces locally
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

token_ids = st.one_of(st.integers(0, VOCAB - 1), st.sampled_from([-1, VOCAB, 2**31 - 1, -(2**31)]))
prompts = st.one_of(
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8),
    st.lists(token_ids, max_size=80),  # empty, out of vocabulary, longer than the context
)
small = st.one_of(st.integers(-2, 70), st.sampled_from([2**31 - 1, -(2**31)]))
LAYOUT = kv_layout(INFO)
OVERRIDES = {
    "cleave.common.v1.RequestMetadata.model": st.sampled_from(["", MODEL, "other"]),
    "cleave.worker.v1.PrefillRequest.prompt_token_ids": prompts,
    "cleave.worker.v1.GenerateRequest.prompt_token_ids": prompts,
    # Small n: the fake engine builds n sequences per token (the worker refuses n > 1024,
    # libs/worker/sampling.py, and the gateway allows far fewer).
    "cleave.common.v1.SamplingParams.n": st.integers(-2, 4),
    "cleave.common.v1.SamplingParams.max_tokens": small,
    "cleave.common.v1.SamplingParams.min_tokens": small,
    "cleave.common.v1.SamplingParams.logprobs": small,
    "cleave.common.v1.SamplingParams.prompt_logprobs": small,
    "cleave.common.v1.SamplingParams.stop_token_ids": st.lists(token_ids, max_size=5),
    "cleave.common.v1.SamplingParams.logit_bias": st.dictionaries(token_ids, st.floats(width=32), max_size=5),
    "cleave.worker.v1.KvHandoff.transport": st.sampled_from(["nixl", "", "ucx"]),
    "cleave.worker.v1.KvHandoff.lease_expires_unix_ms": st.one_of(
        st.just(0), st.integers(-(2**63), 2**63 - 1), st.just(2**62)
    ),
    "cleave.worker.v1.KvHandoff.layout": st.one_of(
        st.just(LAYOUT), st.just(common_pb2.KvLayout()), messages(common_pb2.KvLayout)
    ),
}


class Worker:
    def __init__(self, role: Role, engine: FakeEngine, stub: worker_pb2_grpc.WorkerStub) -> None:
        self.role, self.engine, self.stub = role, engine, stub


@pytest.fixture(scope="module", params=[Role.PREFILL, Role.DECODE, Role.BOTH], ids=lambda r: r.value)
def worker(request: pytest.FixtureRequest) -> Iterator[Worker]:
    role: Role = request.param
    engine = FakeEngine()
    config = WorkerConfig(role=role, model="/nonexistent", served_model_name=MODEL)
    servicer = WorkerServicer(WorkerService(config, engine))
    with background_server(lambda: [binding(servicer)]) as channel:
        yield Worker(role, engine, worker_pb2_grpc.WorkerStub(channel))


def still_serving(worker: Worker) -> None:
    stats = worker.stub.GetStats(pb.GetStatsRequest(), timeout=TIMEOUT_S)
    assert stats.num_running == 0, "a request outlived its RPC"
    assert not worker.engine.running
    assert worker.stub.GetInfo(pb.GetInfoRequest(), timeout=TIMEOUT_S).vocab_size == VOCAB


def _finite_sampling(sampling: common_pb2.SamplingParams) -> bool:
    return all(
        math.isfinite(getattr(sampling, name)) for name in ("presence_penalty", "frequency_penalty")
    ) and all(
        not sampling.HasField(name) or math.isfinite(getattr(sampling, name))
        for name in ("temperature", "top_p", "min_p", "repetition_penalty")
    )


@FUZZ
@given(request=messages(pb.PrefillRequest, OVERRIDES))
def test_prefill(worker: Worker, request: pb.PrefillRequest) -> None:
    response = unary(worker.stub.Prefill, request)
    if worker.role is not Role.PREFILL:
        assert response is None
    elif response is not None:
        assert 0 <= response.first_token_id < VOCAB
        assert response.usage.prompt_tokens == len(request.prompt_token_ids)
    still_serving(worker)


@FUZZ
@given(request=messages(pb.GenerateRequest, OVERRIDES))
def test_generate(worker: Worker, request: pb.GenerateRequest) -> None:
    try:
        responses = list(worker.stub.Generate(request, timeout=TIMEOUT_S))
    except grpc.RpcError as error:
        check_refusal(error, request)
        still_serving(worker)
        return
    assert worker.role is not Role.PREFILL
    kinds = [r.WhichOneof("kind") for r in responses]
    outcome(f"streamed, ended with {kinds[-1] if kinds else 'nothing'}")
    assert kinds and all(k == "chunk" for k in kinds[:-1]), kinds
    assert kinds[-1] in ("complete", "error"), kinds
    if kinds[-1] == "error":
        assert responses[-1].error.code in STREAM_ERRORS, responses[-1].error
    else:
        for response in responses[:-1]:
            assert all(0 <= t < VOCAB for t in response.chunk.token_ids)
    still_serving(worker)


@FUZZ
@given(request=messages(pb.ReleaseKvRequest, OVERRIDES))
def test_release_kv(worker: Worker, request: pb.ReleaseKvRequest) -> None:
    unary(worker.stub.ReleaseKv, request)
    still_serving(worker)


def test_a_valid_request_still_succeeds_after_the_fuzzing(worker: Worker) -> None:
    sampling = common_pb2.SamplingParams(max_tokens=3, temperature=0)
    if worker.role is Role.PREFILL:
        response = worker.stub.Prefill(
            pb.PrefillRequest(prompt_token_ids=[5, 6], sampling=sampling), timeout=10
        )
        assert response.handoff.layout == LAYOUT
    else:
        responses = list(worker.stub.Generate(pb.GenerateRequest(prompt_token_ids=[5, 6], sampling=sampling)))
        assert [t for r in responses[:-1] for t in r.chunk.token_ids] == [7, 8, 9]
        assert responses[-1].WhichOneof("kind") == "complete"
    still_serving(worker)
