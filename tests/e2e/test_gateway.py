"""The OpenAI API end to end: the one-command local stack (gateway + tokenizer + workers, real
SmolLM2) driven by the official `openai` SDK and raw HTTP. It runs on the 1p1d stack that
//tests/e2e:test_vllm_api's suites share (tests/e2e/conftest.py: api_stacks); that stack's chat
template renders every chat without tools as SmolLM2's own template does."""

from __future__ import annotations

import json
import os
import time

import httpx
import openai
import psutil
import pytest

from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from tests.e2e.harness import Service
from tests.e2e.stack import stack_blocking_channel

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
STACKS: dict[str, Service] = {}  # base URL -> its gateway process


@pytest.fixture(scope="module")
def gateway(api_stacks: dict[str, tuple[Service, str]]) -> str:
    # 1p1d by default: prefill -> NIXL -> decode. CLEAVE_E2E_MODE=pd runs the same suite on
    # the colocated stack: ./bazel test //tests/e2e:test_vllm_api --test_env=CLEAVE_E2E_MODE=pd
    service, base_url = api_stacks[os.environ.get("CLEAVE_E2E_MODE", "1p1d")]
    STACKS[base_url] = service
    return base_url


@pytest.fixture
def client(gateway: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused")


def served_model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_capital_of_france_non_streaming_and_streaming_agree(client: openai.OpenAI) -> None:
    model = served_model(client)
    whole = client.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=30)
    text = whole.choices[0].message.content or ""
    assert "Paris" in text
    assert whole.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=30, stream=True,
                                            stream_options={"include_usage": True})  # fmt: skip
    pieces, usage, finish = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == text
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


def test_continuous_usage_stats_count_tokens_on_every_chunk(gateway: str, client: openai.OpenAI) -> None:
    body = {
        "model": served_model(client),
        "messages": QUESTION,
        "max_tokens": 8,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    with httpx.stream("POST", f"{gateway}/v1/chat/completions", json=body, timeout=120) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    content = [e for e in events if e["choices"] and "usage" in e]
    counts = [e["usage"]["completion_tokens"] for e in content]
    assert counts == sorted(counts) and counts[-1] == 8, counts
    assert len({e["usage"]["prompt_tokens"] for e in events if "usage" in e}) == 1
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 8


def test_usage_matches_the_tokenizer(client: openai.OpenAI, gateway: str) -> None:
    model = served_model(client)
    response = client.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=5)
    counted = httpx.post(f"{gateway}/tokenize", json={"model": model, "messages": QUESTION}).json()["count"]
    assert response.usage is not None
    assert response.usage.prompt_tokens == counted
    assert response.usage.total_tokens == counted + response.usage.completion_tokens
    assert response.usage.completion_tokens == 5 and response.choices[0].finish_reason == "length"


def test_stop_string_n_seed_and_logprobs(client: openai.OpenAI) -> None:
    model = served_model(client)
    free = client.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=30)
    full = free.choices[0].message.content or ""
    stopped = client.chat.completions.create(
        model=model, messages=QUESTION, temperature=0, max_tokens=30, stop=["France"]
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == full[: full.index("France")]

    # Temperature honoured: greedy is repeatable; at temperature 1 the n choices differ.
    again = client.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=30)
    assert again.choices[0].message.content == full

    def sampled(seed: int) -> list[str]:
        response = client.chat.completions.create(
            model=model, messages=QUESTION, temperature=1.0, max_tokens=16, n=2, seed=seed
        )
        assert sorted(c.index for c in response.choices) == [0, 1]
        return [c.message.content or "" for c in sorted(response.choices, key=lambda c: c.index)]

    two = sampled(3)
    assert all(text.strip() for text in two), two
    assert two[0] != two[1], f"n=2 at temperature 1 gave the same text twice: {two}"
    assert sampled(3) == two, "the same seed must give the same choices"
    assert sampled(4) != two, "another seed must give other choices"

    with_logprobs = client.chat.completions.create(
        model=model, messages=QUESTION, temperature=0, max_tokens=4, logprobs=True, top_logprobs=2
    )
    content = with_logprobs.choices[0].logprobs.content
    assert content is not None and len(content) == 4
    assert "".join(item.token for item in content) == with_logprobs.choices[0].message.content
    assert all(len(item.top_logprobs) == 2 and item.logprob <= 0 for item in content)
    assert all(item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob for item in content)
    # Greedy: every chosen token is the most likely one.
    for item in content:
        assert item.token == item.top_logprobs[0].token, item
        assert item.logprob == pytest.approx(item.top_logprobs[0].logprob), item
    assert full.startswith(with_logprobs.choices[0].message.content or "")


def test_completions_api_with_echo(client: openai.OpenAI) -> None:
    model = served_model(client)
    response = client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=5, temperature=0, echo=True
    )
    assert response.choices[0].text.startswith("The capital of France is")
    assert response.usage is not None and response.usage.completion_tokens == 5


def test_completions_with_several_prompts(client: openai.OpenAI) -> None:
    model = served_model(client)
    prompts = ["The capital of France is", "One, two, three,"]
    batch = client.completions.create(model=model, prompt=prompts, max_tokens=6, temperature=0)
    singles = [client.completions.create(model=model, prompt=p, max_tokens=6, temperature=0) for p in prompts]
    assert [c.index for c in batch.choices] == [0, 1]
    assert [c.text for c in batch.choices] == [s.choices[0].text for s in singles]
    assert batch.usage is not None
    assert batch.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles if s.usage)


def test_langchain_chat_openai(gateway: str, client: openai.OpenAI) -> None:
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(
        base_url=f"{gateway}/v1", api_key="unused", model=served_model(client), temperature=0, max_tokens=30
    )
    messages = [SystemMessage("You are a helpful assistant."), HumanMessage("What is the capital of France?")]
    answer = chat.invoke(messages)
    assert "Paris" in str(answer.content)
    assert answer.usage_metadata is not None and answer.usage_metadata["output_tokens"] > 0
    streamed = "".join(str(chunk.content) for chunk in chat.stream(messages))
    assert streamed == answer.content


@pytest.mark.anyio
async def test_async_client_streams(gateway: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{gateway}/v1", api_key="unused")
    model = (await client.models.list()).data[0].id
    stream = await client.chat.completions.create(
        model=model, messages=QUESTION, temperature=0, max_tokens=12, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text.strip()


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ("{not json", 400, ""),
        (json.dumps({"model": "M", "messages": "hello"}), 400, "messages"),
        (
            json.dumps({"model": "M", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}),
            400,
            "max_tokens",
        ),
        (
            json.dumps({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}),
            404,
            "does not exist",
        ),
        (
            json.dumps({"model": "M", "messages": [{"role": "user", "content": "word " * 9000}]}),
            400,
            "maximum context length",
        ),
        (
            json.dumps(
                {
                    "model": "M",
                    "messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"type": "function"}],
                }
            ),
            400,
            # Tools are served now; a tool without its function is vLLM's validation 400.
            "body.tools.0.function",
        ),
    ],
)
def test_bad_requests_get_openai_errors_and_the_stack_keeps_serving(
    client: openai.OpenAI, gateway: str, body: str, status: int, fragment: str
) -> None:
    body = body.replace('"M"', json.dumps(served_model(client)))
    response = httpx.post(
        f"{gateway}/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert fragment in error["message"]
    ok = client.chat.completions.create(
        model=served_model(client), messages=QUESTION, temperature=0, max_tokens=2
    )
    assert ok.choices[0].message.content


def worker_stats(address: str) -> worker_pb2.WorkerStats:
    with stack_blocking_channel(address) as channel:
        return worker_pb2_grpc.WorkerStub(channel).GetStats(worker_pb2.GetStatsRequest(), timeout=10)


def test_client_disconnect_aborts_the_request_on_the_worker(gateway: str, client: openai.OpenAI) -> None:
    """Mid-stream, the generating worker runs the request; once the client hangs up, that
    worker aborts it (its abort counter grows) and every worker's KV is free again."""
    (generating,) = [w["address"] for w in httpx.get(f"{gateway}/health").json()["workers"]
                     if w["role"] in ("decode", "both")]  # fmt: skip
    before = worker_stats(generating)
    body = {
        "model": served_model(client),
        "messages": QUESTION,
        "max_tokens": 400,  # with ignore_eos, far more than the seconds below can produce
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", f"{gateway}/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        chunks, running = 0, None
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            choices = json.loads(line[6:])["choices"]
            assert all(c["finish_reason"] is None for c in choices), choices
            chunks += any(c["delta"].get("content") for c in choices)
            if chunks >= 6:
                running = worker_stats(generating)
                break  # leaving the block closes the connection mid-stream
    assert running is not None, f"the stream ended after {chunks} content chunks"
    assert running.num_running == 1 and running.kv_cache_usage > 0, running
    assert running.requests_aborted == before.requests_aborted
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        after = worker_stats(generating)
        workers = httpx.get(f"{gateway}/health").json()["workers"]
        # The engine's running/KV figures come from vLLM's stat loggers, a step behind the
        # abort itself (seen: the abort counted while num_running still said 1): wait for both.
        idle = all(w["kv_cache_usage"] == 0 and w["running"] == 0 for w in workers)
        idle = idle and after.num_running == 0 and after.kv_cache_usage == 0
        if after.requests_aborted > before.requests_aborted and idle:
            assert after.requests_aborted == before.requests_aborted + 1
            return
        time.sleep(0.5)
    raise AssertionError(f"no abort / KV not freed after the client disconnected: {after}, {workers}")


def test_models_health_and_metrics(gateway: str) -> None:
    assert httpx.get(f"{gateway}/health").json()["status"] == "ok"
    metrics = httpx.get(f"{gateway}/metrics").text
    assert "cleave_gateway_ttft_seconds_count" in metrics


def cores_of(device_group: str) -> set[int]:
    """'0,2-3' -> {0, 2, 3}"""
    cores: set[int] = set()
    for part in device_group.split(","):
        first, _, last = part.partition("-")
        cores.update(range(int(first), int(last or first) + 1))
    return cores


def test_every_thread_of_a_worker_runs_on_its_device_group(gateway: str) -> None:
    """The local stack gives each worker its own cores (--device-group); none of the threads of
    the worker, its vLLM EngineCore or vLLM's worker process may run elsewhere. vLLM's NIXL
    worker pins its creating thread, the engine's OpenMP master, to the last core of the
    NUMA node: in 1p1d on two cores the prefill engine then ran on the decode worker's core
    (libs/worker/vllm_nixl_connector.py)."""
    checked = 0
    workers = [
        w
        for w in psutil.Process(STACKS[gateway].process.pid).children()
        if "services.worker.main" in w.cmdline()
    ]
    if not any("--device-group" in w.cmdline() for w in workers):
        pytest.skip(
            "no worker of this stack was given a device group (the colocated stack's worker has every core)"
        )
    for worker in workers:
        cmdline = worker.cmdline()
        if "--device-group" not in cmdline:
            continue
        group = cores_of(cmdline[cmdline.index("--device-group") + 1])
        for process in [worker, *worker.children(recursive=True)]:
            for thread in process.threads():
                try:
                    cores = os.sched_getaffinity(thread.id)
                except ProcessLookupError:
                    continue  # ended meanwhile
                assert cores <= group, (
                    f"{process.name()} thread {thread.id} may run on {sorted(cores)}, not {group}"
                )
                checked += 1
    assert checked, "no worker of the stack has a --device-group"
