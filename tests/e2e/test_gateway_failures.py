"""A real 2p1d stack with SmolLM2 and a kvstore, round-robin routing: stored prompt prefixes
are loaded instead of computed, by the decode worker when the gateway skips prefill and by
the other prefill worker otherwise (their counters say how much), with the same greedy
output as vLLM's own cold run. The stack serves the test LoRA adapter: a prompt sent under
it and then under the base model is computed again, neither prefill worker's cache nor the
kvstore gives the base model the adapter's KV, and each answer is vLLM's own for its model.
Then worker failures: a prefill worker killed under a request
makes the gateway retry that request on the other one (counted), then it is ejected; a decode
worker killed mid-stream gives the client an error event within seconds, and the gateway stops
routing to it.

Between the two, a second gateway over the same workers routing on their KV events, then
admission control: a burst beyond the gateway's queue is refused with 429
and Retry-After while the requests admitted answer.

The tests share one stack and run in file order (the last leaves no decode worker).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.config.flags import parse
from libs.gateway.config import GatewayConfig
from libs.rpc.ports import read_port_file
from libs.tokenization.tokenizer import Tokenizer, TokenizerConfig
from tests.e2e.conftest import LORA_NAME, lora_flags
from tests.e2e.harness import Service, log_dir, start
from tests.e2e.prompts import question, shared_prefix
from tests.e2e.reference_vllm import ReferenceRun
from tests.e2e.stack import (
    kill_worker,
    stack_blocking_channel,
    stack_token_file,
    start_gateway_stack,
    stop_gateway_stack,
    stored_chunks,
)

PREFIX_TOKENS = 1900
MAX_TOKENS = 16
MAX_MODEL_LEN = 4096

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
INFLIGHT = 2  # per worker
QUEUED = 2


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Tokenizer:
    return Tokenizer.from_config(TokenizerConfig(path=model_dir))


@pytest.fixture(scope="module")
def prefix_prompts(tokenizer: Tokenizer) -> dict[str, list[int]]:
    """Two prompts sharing a ~1,900-token prefix; `long_tail` adds ~300 new tokens to it.
    `lora`: another, of ~600 tokens (two kvstore chunks), for the adapter's test."""
    prefix = shared_prefix(tokenizer, seed=3, tokens=PREFIX_TOKENS)
    return {
        "prompt": prefix + question(tokenizer, "Which word comes first?"),
        "long_tail": prefix + shared_prefix(tokenizer, seed=4, tokens=300) + question(tokenizer, "And last?"),
        "lora": shared_prefix(tokenizer, seed=5, tokens=600) + question(tokenizer, "Which word is shortest?"),
    }


@pytest.fixture(scope="module")
def cold_reference_run(
    model_dir: Path, prefix_prompts: dict[str, list[int]], lora_adapter: Path
) -> Iterator[ReferenceRun]:
    """vLLM's own LLM.generate of each prompt in a fresh engine (no cache, no kvstore), from
    the base model and under the test adapter, loading while the stack starts."""
    names = sorted(prefix_prompts)
    run = ReferenceRun(
        log_dir(), "2p1d", model_dir, [prefix_prompts[name] for name in names], MAX_TOKENS,
        "float32", str(MAX_MODEL_LEN), str(lora_adapter), str(names.index("lora")),
    )  # fmt: skip
    try:
        yield run
    finally:
        run.stop()


@pytest.fixture(scope="module")
def cold_references(
    cold_reference_run: ReferenceRun, prefix_prompts: dict[str, list[int]]
) -> dict[str, dict[str, list[int]]]:
    """Each prompt's reference tokens from the base model ("base"); the `lora` prompt's under
    the adapter too ("adapter")."""
    outputs, names = cold_reference_run.outputs(), sorted(prefix_prompts)
    return {
        "base": dict(zip(names, outputs[: len(names)], strict=True)),
        "adapter": dict(zip(["lora"], outputs[len(names) :], strict=True)),
    }


@pytest.fixture(scope="module")
def cold_reference(cold_references: dict[str, dict[str, list[int]]]) -> dict[str, list[int]]:
    return cold_references["base"]


@pytest.fixture(scope="module")
def stack(
    cold_reference_run: ReferenceRun, tmp_path_factory: pytest.TempPathFactory, lora_adapter: Path
) -> Iterator[tuple[Service, str]]:
    service, base_url = start_gateway_stack(
        "2p1d", tmp_path_factory.mktemp("cache"), "--kvstore", "--kvstore-cpu-bytes", "512MiB",
        *lora_flags(lora_adapter),
        "--routing", "round_robin", "--max-model-len", str(MAX_MODEL_LEN),
        # Small admission bounds for test_a_burst_beyond_the_queue_is_429; the other tests
        # send at most 2 requests at once, which these let through.
        "--max-inflight-per-worker", str(INFLIGHT), "--max-queued-requests", str(QUEUED),
        # A killed worker stays dead: these tests are about the gateway, not restarts
        # (tests/e2e/test_lifecycle.py), and a reloading model would compete for the cores.
        "--restart-limit", "0",
    )  # fmt: skip
    try:
        yield service, base_url
    finally:
        stop_gateway_stack(service)


def workers(base_url: str, role: str) -> list[dict[str, object]]:
    return [w for w in httpx.get(f"{base_url}/health", timeout=10).json()["workers"] if w["role"] == role]


def kvstore_address(gateway: Service) -> str:
    """The local stack's kvstore, as its workers were told (the kvstore binds port 0)."""
    for child in psutil.Process(gateway.process.pid).children():
        cmdline = child.cmdline()
        if "services.worker.main" in cmdline and "--kvstore-address" in cmdline:
            return cmdline[cmdline.index("--kvstore-address") + 1]
    raise AssertionError("no worker of the local stack has a --kvstore-address")


def worker_stats(address: str) -> worker_pb2.WorkerStats:
    with stack_blocking_channel(address) as channel:
        return worker_pb2_grpc.WorkerStub(channel).GetStats(worker_pb2.GetStatsRequest(), timeout=10)


def test_stored_prefixes_are_loaded_not_computed(
    stack: tuple[Service, str],
    tokenizer: Tokenizer,
    prefix_prompts: dict[str, list[int]],
    cold_reference: dict[str, list[int]],
) -> None:
    """Cold on one prefill worker; the same prefix with a long new tail goes through the other
    prefill worker, which loads the prefix from the kvstore; the first prompt again skips
    prefill (the kvstore holds all but its last 120 tokens). Every answer equals vLLM's own
    cold run of its prompt."""
    gateway, base_url = stack
    prompt, long_tail = prefix_prompts["prompt"], prefix_prompts["long_tail"]
    expected = {name: tokenizer.decode(ids, skip_special_tokens=True) for name, ids in cold_reference.items()}
    model = served_model(base_url)
    addresses = {role: [str(w["address"]) for w in workers(base_url, role)] for role in ("prefill", "decode")}
    everyone = addresses["prefill"] + addresses["decode"]

    def complete(ids: list[int]) -> str:
        body = {"model": model, "prompt": ids, "max_tokens": MAX_TOKENS, "temperature": 0}
        response = httpx.post(f"{base_url}/v1/completions", json=body, timeout=300)
        assert response.status_code == 200, response.text
        time.sleep(1.5)  # vLLM's stat loggers run after the step
        return str(response.json()["choices"][0]["text"])

    def deltas(before: dict[str, worker_pb2.WorkerStats]) -> tuple[dict[str, int], ...]:
        """Prompt tokens per worker: computed, loaded from the kvstore, hit in its own cache."""
        after = {a: worker_stats(a) for a in everyone}
        return (
            {a: after[a].prompt_tokens_computed - before[a].prompt_tokens_computed for a in everyone},
            {a: after[a].kvstore.tokens_loaded - before[a].kvstore.tokens_loaded for a in everyone},
            {
                a: after[a].prompt_tokens_local_cache_hit - before[a].prompt_tokens_local_cache_hit
                for a in everyone
            },
        )

    before = {a: worker_stats(a) for a in everyone}
    cold = complete(prompt)
    assert cold == expected["prompt"]
    computed, _, _ = deltas(before)
    cold_worker = max(addresses["prefill"], key=lambda a: computed[a])
    assert computed[cold_worker] == len(prompt)
    kvstore = kvstore_address(gateway)
    full_chunks = len(prompt) // 256
    assert asyncio.run(stored_chunks(kvstore, at_least=full_chunks)) >= full_chunks

    before = {a: worker_stats(a) for a in everyone}
    loaded_elsewhere = complete(long_tail)
    computed, loaded, _ = deltas(before)
    print(
        f"same prefix, {len(long_tail) - PREFIX_TOKENS} new tokens: computed {computed}, from the kvstore {loaded}"
    )
    other = next(a for a in addresses["prefill"] if a != cold_worker)
    assert loaded[other] >= 0.9 * PREFIX_TOKENS and computed[other] == len(long_tail) - loaded[other]
    # The prefix KV the other worker saved, loaded here, gives the cold run's answer.
    assert loaded_elsewhere == expected["long_tail"]

    # The decode worker reuses the prefix from its own prefix cache (it received this
    # prompt's KV over NIXL the first time) or from the kvstore; no prefill worker computes.
    before = {a: worker_stats(a) for a in everyone}
    warm = complete(prompt)
    computed, loaded, local = deltas(before)
    print(f"same prompt again: computed {computed}, from the kvstore {loaded}, from local caches {local}")
    decode = addresses["decode"][0]
    assert all(computed[a] == 0 for a in addresses["prefill"]), computed
    reused = loaded[decode] + local[decode]
    assert reused >= 0.9 * PREFIX_TOKENS and computed[decode] == len(prompt) - reused
    assert warm == cold


def test_the_adapters_kv_is_never_the_base_models_in_caches_or_the_kvstore(
    stack: tuple[Service, str],
    prefix_prompts: dict[str, list[int]],
    cold_references: dict[str, dict[str, list[int]]],
) -> None:
    """The `lora` prompt under the adapter (computed, its chunks saved under the adapter's
    keys), then under the base model: computed again, nothing loaded from the kvstore or hit
    in a worker's own cache; then under the adapter again: reused. Each answer is vLLM's own."""
    _, base_url = stack
    prompt = prefix_prompts["lora"]
    models = {"base": served_model(base_url), "adapter": LORA_NAME}
    addresses = [str(w["address"]) for role in ("prefill", "decode") for w in workers(base_url, role)]

    def complete(which: str) -> tuple[dict[str, int], dict[str, int]]:
        """Sends the prompt; per worker: prompt tokens loaded from the kvstore, hit locally."""
        before = {a: worker_stats(a) for a in addresses}
        body = {"model": models[which], "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                "return_token_ids": True}  # fmt: skip
        response = httpx.post(f"{base_url}/v1/completions", json=body, timeout=300)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["token_ids"] == cold_references[which]["lora"], which
        time.sleep(1.5)  # vLLM's stat loggers run after the step
        after = {a: worker_stats(a) for a in addresses}
        return (
            {a: after[a].kvstore.tokens_loaded - before[a].kvstore.tokens_loaded for a in addresses},
            {
                a: after[a].prompt_tokens_local_cache_hit - before[a].prompt_tokens_local_cache_hit
                for a in addresses
            },
        )

    assert cold_references["base"]["lora"] != cold_references["adapter"]["lora"]  # else this proves nothing
    kvstore = kvstore_address(stack[0])
    stored = asyncio.run(stored_chunks(kvstore, at_least=0))
    complete("adapter")
    assert asyncio.run(stored_chunks(kvstore, at_least=stored + 2)) >= stored + 2  # under the adapter's keys
    loaded, local = complete("base")
    assert sum(loaded.values()) == 0 and sum(local.values()) == 0, (loaded, local)
    loaded, local = complete("adapter")
    assert sum(loaded.values()) + sum(local.values()) >= 512, (loaded, local)  # its own KV, reused


def stack_tokenizer(gateway: Service) -> str:
    """The local stack's tokenizer address (it binds port 0 and writes the port to a file)."""
    for child in psutil.Process(gateway.process.pid).children():
        cmdline = child.cmdline()
        if "services.tokenizer.main" in cmdline and "--port-file" in cmdline:
            return f"127.0.0.1:{read_port_file(Path(cmdline[cmdline.index('--port-file') + 1]))}"
    raise AssertionError("the local stack has no tokenizer child with a --port-file")


def test_a_second_gateway_routing_on_kv_events_sends_a_repeated_prefix_to_the_worker_holding_it(
    stack: tuple[Service, str], tokenizer: Tokenizer, tmp_path: Path
) -> None:
    """A second gateway over the same workers (any number may serve one fleet), with
    --routing kv_events: a new long prompt is computed on one prefill worker, and each repeat
    goes back to that worker (a hit in its own prefix cache, which its KV events reported),
    never to the other, which round_robin would have sent every other repeat to."""
    gateway, base_url = stack
    addresses = {role: [str(w["address"]) for w in workers(base_url, role)] for role in ("prefill", "decode")}
    flags = [
        "--port", "0", "--routing", "kv_events", "--max-model-len", str(MAX_MODEL_LEN),
        "--tokenizer", stack_tokenizer(gateway),
        "--prefill-workers", ",".join(addresses["prefill"]), "--decode-workers", ",".join(addresses["decode"]),
        "--grpc-token-file", str(stack_token_file(tmp_path)),
    ]  # fmt: skip
    second = start("gateway-kv-events", "services.gateway.main", parse(GatewayConfig, flags))
    try:
        url = second.wait_http_ready(120)
        prompt = shared_prefix(tokenizer, seed=11, tokens=1500) + question(
            tokenizer, "Which word is longest?"
        )
        body = {"model": served_model(base_url), "prompt": prompt, "max_tokens": 2, "temperature": 0}
        everyone = addresses["prefill"]
        hits: list[dict[str, int]] = []
        computed: list[dict[str, int]] = []
        for _ in range(3):
            before = {a: worker_stats(a) for a in everyone}
            response = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
            assert response.status_code == 200, response.text
            time.sleep(1.5)  # vLLM's stat loggers run after the step
            after = {a: worker_stats(a) for a in everyone}
            hits.append(
                {
                    a: after[a].prompt_tokens_local_cache_hit - before[a].prompt_tokens_local_cache_hit
                    for a in everyone
                }
            )
            computed.append(
                {a: after[a].prompt_tokens_computed - before[a].prompt_tokens_computed for a in everyone}
            )
        print(f"kv_events routing, the same prompt three times: local cache hits {hits}, computed {computed}")
        first = max(everyone, key=lambda a: computed[0][a] + hits[0][a])
        other = next(a for a in everyone if a != first)
        full_blocks = (len(prompt) - 1) // 128 * 128  # vLLM computes the last token; CPU blocks of 128
        for repeat in (1, 2):
            assert hits[repeat][first] >= full_blocks, (repeat, hits, computed)
            assert hits[repeat][other] == 0 and computed[repeat][other] == 0, (repeat, hits, computed)
    finally:
        second.stop()


def test_a_burst_beyond_the_queue_is_429_with_retry_after(stack: tuple[Service, str]) -> None:
    """One decode worker takes INFLIGHT requests, QUEUED more wait in the gateway, the rest
    of a simultaneous burst are refused at once with 429 and Retry-After; the others answer."""
    _, base_url = stack
    model = served_model(base_url)
    burst = 3 * (INFLIGHT + QUEUED)
    with ThreadPoolExecutor(burst) as pool:
        answers = list(
            pool.map(lambda _: chat(base_url, model, max_tokens=32, ignore_eos=True), range(burst))
        )
    statuses = [a.status_code for a in answers]
    print(f"burst of {burst}: {statuses.count(200)} answered, {statuses.count(429)} refused")
    assert set(statuses) <= {200, 429}, [a.text for a in answers if a.status_code not in (200, 429)]
    assert statuses.count(200) >= INFLIGHT + QUEUED and statuses.count(429) >= 1
    for refused in (a for a in answers if a.status_code == 429):
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    queue_full = 'cleave_gateway_admission_rejected_total{reason="queue_full"}'
    assert metric(base_url, queue_full) == statuses.count(429)
    assert metric(base_url, "cleave_gateway_queue_depth") == 0


def metric(base_url: str, series: str) -> float:
    """One series' value on the gateway's /metrics (0 before it exists)."""
    for line in httpx.get(f"{base_url}/metrics", timeout=10).text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def retries(base_url: str, stage: str) -> float:
    """cleave_gateway_retries_total{stage} on the gateway's /metrics (0 before the first)."""
    return metric(base_url, f'cleave_gateway_retries_total{{stage="{stage}"}}')


def chat(base_url: str, model: str, **extra: object) -> httpx.Response:
    body = {"model": model, "messages": QUESTION, "max_tokens": 8, "temperature": 0, **extra}
    return httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)


def served_model(base_url: str) -> str:
    return str(httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["id"])


def wait_until_unhealthy(base_url: str, address: str, timeout_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if not any(w["healthy"] for w in workers(base_url, "prefill") + workers(base_url, "decode")
                   if w["address"] == address):  # fmt: skip
            return time.monotonic() - started
        time.sleep(0.2)
    raise AssertionError(f"{address} still routed to after {timeout_s} s")


def test_prefill_worker_killed_under_a_request_is_retried_elsewhere(stack: tuple[Service, str]) -> None:
    gateway, base_url = stack
    model = served_model(base_url)
    prefills = workers(base_url, "prefill")
    assert len(prefills) == 2 and all(w["healthy"] for w in prefills), prefills
    baseline = chat(base_url, model)
    assert baseline.status_code == 200, baseline.text
    retried_before = retries(base_url, "prefill")

    victim = str(prefills[0]["address"])
    # Frozen first, so that round robin hands it one of two requests while the stats poller
    # still counts it healthy (it ejects at once only on a refused connection; a silent worker
    # after 3 slow polls, >= 9 s). Killing it then fails that request's Prefill under the
    # gateway: only a retry on the other prefill worker can answer it.
    kill_worker(gateway, victim, signal.SIGSTOP)
    killed = False
    try:
        with ThreadPoolExecutor(2) as pool:
            pending = [pool.submit(chat, base_url, model) for _ in range(2)]
            time.sleep(3)
            assert victim in [w["address"] for w in workers(base_url, "prefill") if w["healthy"]]
            kill_worker(gateway, victim)
            killed = True
            racing = [future.result() for future in pending]
    finally:
        if not killed:
            kill_worker(gateway, victim)  # never leave a stopped worker behind
    assert [a.status_code for a in racing] == [200, 200], [a.text for a in racing]
    retried = retries(base_url, "prefill") - retried_before
    print(f"prefill retries after the kill: {retried:.0f}")
    assert retried >= 1, "the request on the killed prefill worker succeeded without a retry"

    # Requests right after may still pick the dead worker until it is ejected: all succeed.
    answers = racing + [chat(base_url, model) for _ in range(4)]
    assert [a.status_code for a in answers] == [200] * 6, [a.text for a in answers]
    texts = {a.json()["choices"][0]["message"]["content"] for a in answers}
    assert texts == {baseline.json()["choices"][0]["message"]["content"]}

    ejected_after = wait_until_unhealthy(base_url, victim, timeout_s=10)
    print(f"killed prefill worker ejected within {ejected_after:.1f} s of the requests")
    survivors = [w for w in workers(base_url, "prefill") if w["healthy"]]
    assert [w["address"] for w in survivors] == [prefills[1]["address"]]


def test_decode_killed_mid_stream_gives_an_error_event(stack: tuple[Service, str]) -> None:
    gateway, base_url = stack
    model = served_model(base_url)
    (decode,) = workers(base_url, "decode")
    body = {"model": model, "messages": QUESTION, "max_tokens": 1000, "ignore_eos": True, "stream": True}
    events: list[str] = []
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        killed_at = None
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[len("data: ") :])
            if len(events) == 5 and killed_at is None:
                kill_worker(gateway, str(decode["address"]))
                killed_at = time.monotonic()
        assert killed_at is not None, events
        error_after = time.monotonic() - killed_at
    print(f"client got the error event {error_after:.1f} s after the decode worker was killed")
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "worker_failed" and "decode" in error["message"], error
    assert error_after < 10

    wait_until_unhealthy(base_url, str(decode["address"]), timeout_s=10)
    refused = chat(base_url, model)
    assert refused.status_code == 503, refused.text
    assert "decode" in refused.json()["error"]["message"]
