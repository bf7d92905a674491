"""The worker's request logic against an in-memory engine (no vLLM, no network)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2
from libs.config.roles import Role
from libs.worker.config import WorkerConfig
from libs.worker.engine import Adapter, EngineStep
from libs.worker.errors import InvalidRequest, KvTransferFailed
from libs.worker.handoff import UntrustedPeer
from libs.worker.service import WorkerService, WrongRole
from tests.libs.worker.fake_engine import INFO, FakeEngine

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(
    role: Role, engine: FakeEngine | None = None, clock: Clock | None = None, *, enable_lora: bool = False
) -> tuple[WorkerService, FakeEngine]:
    engine = engine or FakeEngine()
    config = WorkerConfig(
        role=role, model="/nonexistent", served_model_name="fake", kv_lease_s=30, enable_lora=enable_lora
    )
    return WorkerService(config, engine, address="127.0.0.1:1", clock=clock or Clock()), engine


def meta(request_id: str) -> common_pb2.RequestMetadata:
    return common_pb2.RequestMetadata(request_id=request_id)


async def collect(
    service: WorkerService, request: worker_pb2.GenerateRequest
) -> list[worker_pb2.GenerateResponse]:
    return [r async for r in service.generate(request)]


async def test_prefill_returns_first_token_and_leased_handoff() -> None:
    clock = Clock()
    service, engine = make(Role.PREFILL, clock=clock)
    response = await service.prefill(
        worker_pb2.PrefillRequest(metadata=meta("r1"), prompt_token_ids=[5, 6, 7])
    )
    assert response.first_token_id == 8
    assert response.handoff.transport == "nixl"
    assert response.handoff.num_tokens == 3
    assert [list(g.ids) for g in response.handoff.block_ids] == [[1, 2]]
    assert response.handoff.lease_expires_unix_ms == int((clock.now + 30) * 1000)
    assert response.handoff.layout.model_fingerprint == "f00d"
    assert response.handoff.worker_address == "127.0.0.1:1"
    assert engine.calls[0]["sampling"]["max_tokens"] == 1
    assert engine.calls[0]["kv"] == {"do_remote_decode": True}
    assert service.stats().num_leased == 1
    clock.now += 31
    assert service.stats().num_leased == 0


async def test_decode_with_handoff_loads_external_kv_and_streams() -> None:
    prefill, _ = make(Role.PREFILL)
    handoff = (
        await prefill.prefill(worker_pb2.PrefillRequest(metadata=meta("r"), prompt_token_ids=[5, 6, 7]))
    ).handoff
    decode, engine = make(Role.DECODE)
    sampling = common_pb2.SamplingParams(max_tokens=4)
    request = worker_pb2.GenerateRequest(
        metadata=meta("r"), prompt_token_ids=[5, 6, 7], sampling=sampling, handoff=handoff
    )
    responses = await collect(decode, request)
    tokens = [t for r in responses if r.HasField("chunk") for t in r.chunk.token_ids]
    assert tokens == [8, 9, 10, 11]
    assert responses[-1].HasField("complete")
    assert responses[-2].chunk.finish_reason == common_pb2.FINISH_REASON_LENGTH
    usage = responses[-1].complete.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_prompt_tokens) == (3, 4, 3)
    assert engine.calls[0]["kv"]["do_remote_prefill"] is True
    assert engine.calls[0]["kv"]["remote_block_ids"] == [[1, 2]]
    assert decode.stats().prompt_tokens_external == 3


async def test_kv_the_engine_could_not_load_is_an_error_not_an_empty_answer() -> None:
    prefill, _ = make(Role.PREFILL)
    handoff = (
        await prefill.prefill(worker_pb2.PrefillRequest(metadata=meta("r"), prompt_token_ids=[5, 6, 7]))
    ).handoff
    decode, _ = make(Role.DECODE, FakeEngine(fail_kv_loads=True))
    request = worker_pb2.GenerateRequest(metadata=meta("r"), prompt_token_ids=[5, 6, 7], handoff=handoff)
    with pytest.raises(KvTransferFailed, match="could not load the handed-over KV"):
        await collect(decode, request)


async def test_layout_mismatch_is_refused() -> None:
    prefill, _ = make(Role.PREFILL)
    handoff = (
        await prefill.prefill(worker_pb2.PrefillRequest(metadata=meta("r"), prompt_token_ids=[1, 2]))
    ).handoff
    handoff.layout.block_size = 128
    decode, engine = make(Role.DECODE)
    request = worker_pb2.GenerateRequest(metadata=meta("r"), prompt_token_ids=[1, 2], handoff=handoff)
    with pytest.raises(InvalidRequest, match=r"block_size: prefill 128 vs decode 16"):
        await collect(decode, request)
    assert engine.calls == []


async def test_n_sequences_and_stop_token() -> None:
    service, _ = make(Role.BOTH)
    sampling = common_pb2.SamplingParams(max_tokens=10, n=2, stop_token_ids=[4])
    responses = await collect(
        service, worker_pb2.GenerateRequest(metadata=meta("n"), prompt_token_ids=[1], sampling=sampling)
    )
    chunks = [r.chunk for r in responses if r.HasField("chunk")]
    assert {c.index for c in chunks} == {0, 1}
    finals = [c for c in chunks if c.finish_reason]
    assert all(c.finish_reason == common_pb2.FINISH_REASON_STOP and c.stop_token_id == 4 for c in finals)
    assert responses[-1].complete.usage.completion_tokens == 6  # 2 sequences x (2, 3, 4)


async def test_cancelled_stream_aborts_engine_request() -> None:
    service, engine = make(Role.BOTH, FakeEngine(token_delay_s=0.05))
    request = worker_pb2.GenerateRequest(
        metadata=meta("slow"), prompt_token_ids=[1], sampling=common_pb2.SamplingParams(max_tokens=50)
    )

    async def consume() -> None:
        async for _ in service.generate(request):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.aborted == ["slow"]
    assert engine.running == set()
    assert service.stats().requests_aborted == 1


async def test_finished_request_is_not_aborted() -> None:
    service, engine = make(Role.BOTH)
    await collect(
        service,
        worker_pb2.GenerateRequest(
            metadata=meta("ok"), prompt_token_ids=[1], sampling=common_pb2.SamplingParams(max_tokens=2)
        ),
    )
    assert engine.aborted == []
    assert service.stats().requests_aborted == 0


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "message"),
    [
        ([], 1, "prompt is empty"),
        ([1] * 64, 1, "prompt has 64 tokens; this model's context is 64"),
        ([1, 1000, -1], 1, r"2 token id\(s\) outside the vocabulary \[0, 1000\): 1000, -1"),
        ([1], 100, "max_tokens=100 plus the prompt's 1 tokens exceeds"),
    ],
)
async def test_bad_requests_are_invalid_argument(prompt: list[int], max_tokens: int, message: str) -> None:
    service, engine = make(Role.BOTH)
    request = worker_pb2.GenerateRequest(
        metadata=meta("bad"),
        prompt_token_ids=prompt,
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens),
    )
    with pytest.raises(InvalidRequest, match=message):
        await collect(service, request)
    assert engine.calls == []


async def test_roles_guard_their_calls() -> None:
    prefill, _ = make(Role.PREFILL)
    with pytest.raises(WrongRole, match="Generate needs a decode or both worker"):
        await collect(prefill, worker_pb2.GenerateRequest(prompt_token_ids=[1]))
    both, _ = make(Role.BOTH)
    with pytest.raises(WrongRole, match="Prefill needs a prefill worker"):
        await both.prefill(worker_pb2.PrefillRequest(prompt_token_ids=[1]))
    handoff = worker_pb2.KvHandoff(transport="nixl")
    with pytest.raises(InvalidRequest, match="role both"):
        await collect(both, worker_pb2.GenerateRequest(prompt_token_ids=[1], handoff=handoff))


async def test_release_goes_through_decode() -> None:
    prefill, _ = make(Role.PREFILL)
    response = await prefill.prefill(worker_pb2.PrefillRequest(metadata=meta("a"), prompt_token_ids=[1, 2]))
    decode, dengine = make(Role.DECODE)
    await decode.release_kv(worker_pb2.ReleaseKvRequest(request_id="a", handoff=response.handoff))
    assert dengine.released[0][0] == "a"
    assert dengine.released[0][1]["remote_request_id"] == "a-x"


async def test_expired_handoff_is_refused_not_pulled() -> None:
    clock = Clock()
    prefill, _ = make(Role.PREFILL, clock=clock)
    handoff = (
        await prefill.prefill(worker_pb2.PrefillRequest(metadata=meta("x"), prompt_token_ids=[1, 2]))
    ).handoff
    decode, engine = make(Role.DECODE, clock=clock)
    clock.now += 31
    with pytest.raises(KvTransferFailed, match="lease expired"):
        await collect(
            decode, worker_pb2.GenerateRequest(metadata=meta("x"), prompt_token_ids=[1, 2], handoff=handoff)
        )
    assert engine.calls == []


class SlowPull(FakeEngine):
    """An engine whose first output comes after the handoff's lease ended (a busy decode)."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    async def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[EngineStep]:
        self.clock.now += 31
        async for step in super().generate(*args, **kwargs):
            yield step


async def test_kv_that_arrives_after_its_lease_is_refused_and_the_request_aborted() -> None:
    clock = Clock()
    prefill, _ = make(Role.PREFILL, clock=clock)
    handoff = (
        await prefill.prefill(worker_pb2.PrefillRequest(metadata=meta("y"), prompt_token_ids=[1, 2]))
    ).handoff
    engine = SlowPull(clock)
    decode, _ = make(Role.DECODE, engine=engine, clock=clock)
    request = worker_pb2.GenerateRequest(metadata=meta("y"), prompt_token_ids=[1, 2], handoff=handoff)
    streamed: list[worker_pb2.GenerateResponse] = []

    async def stream() -> None:
        async for response in decode.generate(request):
            streamed.append(response)

    with pytest.raises(KvTransferFailed, match=r"arrived 1\.0s after its lease expired"):
        await stream()
    assert streamed == []
    assert engine.aborted == ["y"]


async def prefilled_handoff() -> worker_pb2.KvHandoff:
    prefill, _ = make(Role.PREFILL)
    response = await prefill.prefill(worker_pb2.PrefillRequest(metadata=meta("r"), prompt_token_ids=[1, 2]))
    return response.handoff


@pytest.mark.parametrize(
    ("forge", "message"),
    [
        (lambda h: h.ClearField("lease_expires_unix_ms"), "carries no lease"),
        (lambda h: setattr(h, "lease_expires_unix_ms", 10**15), "implausibly far"),
        (lambda h: setattr(h, "host", "203.0.113.7"), "does not pull from"),  # UntrustedPeer
        (lambda h: setattr(h, "host", "prefill.example"), "does not pull from"),
        (lambda h: setattr(h, "port", 0), "not 1..65535"),
    ],
    ids=["no-lease", "far-lease", "foreign-ip", "foreign-name", "no-port"],
)
async def test_a_forged_handoff_is_refused_before_the_engine_sees_it(
    forge: Callable[[worker_pb2.KvHandoff], None], message: str
) -> None:
    handoff = await prefilled_handoff()
    forge(handoff)
    decode, engine = make(Role.DECODE)
    request = worker_pb2.GenerateRequest(metadata=meta("r"), prompt_token_ids=[1, 2], handoff=handoff)
    refusal = UntrustedPeer if "pull from" in message else InvalidRequest
    with pytest.raises(refusal, match=message):
        await collect(decode, request)
    assert engine.calls == []


async def test_allowed_hosts_and_the_own_kv_host_are_pulled_from() -> None:
    engine = FakeEngine()
    config = WorkerConfig(
        role=Role.DECODE,
        model="/nonexistent",
        served_model_name="fake",
        kv_host="10.0.0.2",
        kv_allowed_hosts=("10.0.0.1", "Prefill-A"),
    )
    decode = WorkerService(config, engine, clock=Clock())
    for host in ("10.0.0.1", "prefill-a", "10.0.0.2", "localhost", "::1"):
        handoff = await prefilled_handoff()
        handoff.host = host
        request = worker_pb2.GenerateRequest(metadata=meta(host), prompt_token_ids=[1, 2], handoff=handoff)
        await collect(decode, request)
    assert [call["kv"]["remote_host"] for call in engine.calls] == [
        "10.0.0.1",
        "prefill-a",
        "10.0.0.2",
        "localhost",
        "::1",
    ]
    handoff.host = "10.0.0.3"
    with pytest.raises(UntrustedPeer, match="does not pull from"):
        await decode.release_kv(worker_pb2.ReleaseKvRequest(request_id="x", handoff=handoff))
    assert engine.released == []


async def test_the_cache_salt_reaches_the_engine_on_prefill_and_decode() -> None:
    prefill, pengine = make(Role.PREFILL)
    salted = common_pb2.RequestMetadata(request_id="s", cache_salt="tenant-a")
    handoff = (
        await prefill.prefill(worker_pb2.PrefillRequest(metadata=salted, prompt_token_ids=[1, 2]))
    ).handoff
    decode, dengine = make(Role.DECODE)
    await collect(
        decode, worker_pb2.GenerateRequest(metadata=salted, prompt_token_ids=[1, 2], handoff=handoff)
    )
    await collect(decode, worker_pb2.GenerateRequest(metadata=meta("u"), prompt_token_ids=[1, 2]))
    assert [c["cache_salt"] for c in pengine.calls + dengine.calls] == ["tenant-a", "tenant-a", ""]


async def test_the_lora_adapter_reaches_the_engine_on_prefill_and_decode() -> None:
    adapter = common_pb2.LoraAdapter(name="sql", path="/adapters/sql")
    metadata = common_pb2.RequestMetadata(request_id="a", lora=adapter)
    prefill, pengine = make(Role.PREFILL, enable_lora=True)
    handoff = (
        await prefill.prefill(worker_pb2.PrefillRequest(metadata=metadata, prompt_token_ids=[1, 2]))
    ).handoff
    decode, dengine = make(Role.DECODE, enable_lora=True)
    await collect(
        decode, worker_pb2.GenerateRequest(metadata=metadata, prompt_token_ids=[1, 2], handoff=handoff)
    )
    await collect(decode, worker_pb2.GenerateRequest(metadata=meta("base"), prompt_token_ids=[1, 2]))
    assert [c["lora"] for c in pengine.calls + dengine.calls] == [
        Adapter("sql", "/adapters/sql"),
        Adapter("sql", "/adapters/sql"),
        None,
    ]


async def test_an_adapter_on_a_worker_without_lora_or_without_a_path_is_the_clients_mistake() -> None:
    plain, engine = make(Role.BOTH)
    adapter = common_pb2.LoraAdapter(name="sql", path="/adapters/sql")
    with pytest.raises(InvalidRequest, match="--enable-lora"):
        await collect(
            plain,
            worker_pb2.GenerateRequest(
                metadata=common_pb2.RequestMetadata(request_id="a", lora=adapter), prompt_token_ids=[1]
            ),
        )
    serving, _ = make(Role.BOTH, enable_lora=True)
    with pytest.raises(InvalidRequest, match="name and a path"):
        await collect(
            serving,
            worker_pb2.GenerateRequest(
                metadata=common_pb2.RequestMetadata(request_id="b", lora=common_pb2.LoraAdapter(name="sql")),
                prompt_token_ids=[1],
            ),
        )
    assert engine.calls == []


async def test_load_lora_adapter_loads_it_into_the_engine_only_where_lora_is_on() -> None:
    adapter = common_pb2.LoraAdapter(name="sql", path="/adapters/sql")
    serving, engine = make(Role.DECODE, enable_lora=True)
    await serving.load_lora_adapter(worker_pb2.LoadLoraAdapterRequest(adapter=adapter))
    assert engine.loaded_adapters == [Adapter("sql", "/adapters/sql")]
    plain, plain_engine = make(Role.DECODE)
    with pytest.raises(InvalidRequest, match="--enable-lora"):
        await plain.load_lora_adapter(worker_pb2.LoadLoraAdapterRequest(adapter=adapter))
    with pytest.raises(InvalidRequest, match="name and a path"):
        await serving.load_lora_adapter(
            worker_pb2.LoadLoraAdapterRequest(adapter=common_pb2.LoraAdapter(name="sql"))
        )
    assert plain_engine.loaded_adapters == []


async def test_wait_engine_dead_returns_once_the_engine_has_died() -> None:
    service, engine = make(Role.BOTH)
    waiting = asyncio.create_task(service.wait_engine_dead(poll_s=0.01))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # alive: still waiting
    engine.dead = True
    await asyncio.wait_for(waiting, timeout=5)


async def test_info_carries_the_models_max_new_tokens_only_when_it_has_one() -> None:
    plain, _ = make(Role.BOTH)
    assert not plain.info().HasField("default_max_tokens")
    # vLLM's get_diff_sampling_param names generation_config.json's max_new_tokens max_tokens.
    auto = FakeEngine(dataclasses.replace(INFO, sampling_defaults={"temperature": 0.6, "max_tokens": 256}))
    service, _ = make(Role.BOTH, auto)
    assert service.info().default_max_tokens == 256


async def test_info_carries_the_engines_max_logprobs() -> None:
    service, _ = make(Role.BOTH)
    assert service.info().max_logprobs == 20  # vLLM's default
    engine = FakeEngine()
    config = WorkerConfig(role=Role.DECODE, model="/nonexistent", served_model_name="fake", max_logprobs=-1)
    assert WorkerService(config, engine, address="127.0.0.1:1", clock=Clock()).info().max_logprobs == -1


async def test_prompt_logprobs_come_with_prefill_and_with_colocated_generation() -> None:
    sampling = common_pb2.SamplingParams(max_tokens=2, prompt_logprobs=1)
    prefill, _ = make(Role.PREFILL)
    response = await prefill.prefill(
        worker_pb2.PrefillRequest(metadata=meta("p"), prompt_token_ids=[5, 6, 7], sampling=sampling)
    )
    both, _ = make(Role.BOTH)
    responses = await collect(
        both, worker_pb2.GenerateRequest(metadata=meta("b"), prompt_token_ids=[5, 6, 7], sampling=sampling)
    )
    complete = responses[-1].complete
    # Also on the first chunk (a caller stopping early never reads the complete), only there.
    assert list(responses[0].chunk.prompt_logprobs) == list(complete.prompt_logprobs)
    assert not responses[1].chunk.prompt_logprobs
    for entries in (response.prompt_logprobs, complete.prompt_logprobs):
        # The first prompt token has none (an empty entry), as in vLLM.
        assert [(e.token_id, e.logprob) for e in entries] == [(0, 0.0), (6, -1.0), (7, -2.0)]


async def test_no_prompt_logprobs_unless_asked() -> None:
    both, _ = make(Role.BOTH)
    responses = await collect(
        both,
        worker_pb2.GenerateRequest(
            metadata=meta("b"), prompt_token_ids=[5, 6], sampling=common_pb2.SamplingParams(max_tokens=1)
        ),
    )
    assert not responses[-1].complete.prompt_logprobs


def test_sampling_passes_allowed_token_ids_xargs_and_bad_words() -> None:
    from libs.worker.sampling import BAD_WORDS_TOKEN_IDS, sampling_kwargs

    params = common_pb2.SamplingParams(
        allowed_token_ids=[3, 4],
        extra_args_json='{"k": 1}',
        bad_words_token_ids=[common_pb2.TokenIds(ids=[7, 8])],
    )
    kwargs = sampling_kwargs(params, max_tokens=4)
    assert kwargs["allowed_token_ids"] == [3, 4]
    assert kwargs["extra_args"] == {"k": 1}
    assert kwargs[BAD_WORDS_TOKEN_IDS] == [[7, 8]]
    with pytest.raises(InvalidRequest, match="vllm_xargs"):
        sampling_kwargs(common_pb2.SamplingParams(extra_args_json="[1]"), max_tokens=4)
