"""vLLM's extension parameters through the real stack, in `pd` and `1p1d` (the stacks this
target shares with test_structured_output; a few requests): prompt logprobs and completions'
echo with logprobs (in 1p1d the prefill worker computes them, decode none) equal the worker's
own numbers and agree between the two modes; return_token_ids; stop_token_ids and min_tokens
with their real effect; chat's continue_final_message with echo; the batched chat endpoint."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from tests.e2e.harness import Service
from tests.e2e.stack import stack_channel

PROMPT = "The capital of France is"
# Prompt logprobs of each mode, compared once both ran (pytest runs one mode's tests, then the other's).
SEEN: dict[str, list[Any]] = {}


@pytest.fixture(scope="module", params=["1p1d", "pd"])
def stack(request: pytest.FixtureRequest, api_stacks: dict[str, tuple[Service, str]]) -> tuple[str, str]:
    """The shared stack of that mode (tests/e2e/conftest.py: its flags)."""
    return request.param, api_stacks[request.param][1]


def post(base_url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    model = httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["id"]
    response = httpx.post(f"{base_url}{path}", json={"model": model, **body}, timeout=300)
    assert response.status_code == 200, response.text
    return dict(response.json())


def stream_completion(base_url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """A streamed completion's choices, one per chunk that carries one."""
    model = httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["id"]
    choices = []
    request = {"model": model, "stream": True, **body}
    with httpx.stream("POST", f"{base_url}/v1/completions", json=request, timeout=300) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                choices.extend(json.loads(line[len("data: ") :])["choices"])
    return choices


def worker_prompt_logprobs(
    base_url: str, mode: str, prompt: list[int], top: int
) -> list[common_pb2.TokenLogprob]:
    """The worker's own prompt logprobs for `prompt`: the prefill worker's Prefill (1p1d) or
    the colocated worker's Generate (pd), called directly over gRPC."""
    workers = httpx.get(f"{base_url}/health", timeout=10).json()["workers"]
    role = "prefill" if mode == "1p1d" else "both"
    address = next(w["address"] for w in workers if w["role"] == role)
    sampling = common_pb2.SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=top)

    async def call() -> list[common_pb2.TokenLogprob]:
        async with stack_channel(address) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            metadata = common_pb2.RequestMetadata(request_id=f"direct-{mode}")
            if role == "prefill":
                response = await stub.Prefill(
                    worker_pb2.PrefillRequest(metadata=metadata, prompt_token_ids=prompt, sampling=sampling)
                )
                # A handoff nobody pulls: its lease (--kv-lease-s) frees the KV.
                return list(response.prompt_logprobs)
            async for item in stub.Generate(
                worker_pb2.GenerateRequest(metadata=metadata, prompt_token_ids=prompt, sampling=sampling)
            ):
                if item.WhichOneof("kind") == "complete":
                    return list(item.complete.prompt_logprobs)
            raise AssertionError("the worker's stream ended without its complete message")

    return asyncio.run(call())


def test_echo_with_logprobs_and_prompt_logprobs_are_the_workers(stack: tuple[str, str]) -> None:
    mode, base_url = stack
    body = post(
        base_url,
        "/v1/completions",
        {
            "prompt": PROMPT,
            "max_tokens": 4,
            "temperature": 0,
            "echo": True,
            "logprobs": 2,
            "return_token_ids": True,
        },
    )
    choice = body["choices"][0]
    prompt, generated = choice["prompt_token_ids"], choice["token_ids"]
    assert len(generated) == 4 and choice["text"].startswith(PROMPT)
    logprobs = choice["logprobs"]
    # vLLM's echo: the prompt's tokens lead the logprobs, the first without one.
    assert len(logprobs["tokens"]) == len(prompt) + len(generated)
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    prompt_entries = choice["prompt_logprobs"]
    assert len(prompt_entries) == len(prompt) and prompt_entries[0] is None
    own = worker_prompt_logprobs(base_url, mode, prompt, 2)
    assert len(own) == len(prompt)
    for position in range(1, len(prompt)):
        token = str(prompt[position])
        shown = prompt_entries[position][token]["logprob"]
        assert shown == pytest.approx(own[position].logprob, abs=1e-4), position
        assert logprobs["token_logprobs"][position] == pytest.approx(shown, abs=1e-6)
        # The prompt token and the 2 best (the token itself may be one of them).
        assert 2 <= len(prompt_entries[position]) <= 3
    # Streamed, as vLLM's: the first chunk echoes the prompt with its logprobs, then the rest.
    streamed = stream_completion(
        base_url, {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "echo": True, "logprobs": 2}
    )
    assert "".join(c["text"] for c in streamed) == choice["text"]
    joined = {key: [v for c in streamed if c["logprobs"] for v in c["logprobs"][key]] for key in logprobs}
    assert joined["tokens"] == logprobs["tokens"] and joined["text_offset"] == logprobs["text_offset"]
    assert joined["token_logprobs"][0] is None
    assert joined["token_logprobs"][1:] == pytest.approx(logprobs["token_logprobs"][1:], abs=1e-4)
    assert len(streamed[0]["logprobs"]["tokens"]) > len(prompt)  # the prompt's, in the first chunk
    SEEN[mode] = [entry[str(prompt[i])]["logprob"] for i, entry in enumerate(prompt_entries) if entry]
    if len(SEEN) == 2:
        # float32: the prefill worker's numbers (1p1d) and the colocated worker's (pd) agree.
        assert SEEN["1p1d"] == pytest.approx(SEEN["pd"], abs=1e-3)


def test_stop_token_ids_end_the_sequence_with_their_stop_reason(stack: tuple[str, str]) -> None:
    _mode, base_url = stack
    request = {
        "prompt": PROMPT,
        "max_tokens": 8,
        "temperature": 0,
        "return_token_ids": True,
        "ignore_eos": True,
    }
    free = post(base_url, "/v1/completions", request)["choices"][0]
    stop_id = free["token_ids"][3]
    stopped = post(base_url, "/v1/completions", {**request, "stop_token_ids": [stop_id]})["choices"][0]
    end = free["token_ids"].index(stop_id) + 1
    assert stopped["token_ids"] == free["token_ids"][:end]
    assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] == stop_id
    # vLLM leaves the stop token's text out unless include_stop_str_in_output.
    assert free["text"].startswith(stopped["text"]) and len(stopped["text"]) < len(free["text"])


def test_min_tokens_holds_back_the_end(stack: tuple[str, str]) -> None:
    _mode, base_url = stack
    request = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 64, "temperature": 0}
    free = post(base_url, "/v1/chat/completions", request)
    assert free["choices"][0]["finish_reason"] == "stop"  # the model ended by itself
    ended_after = free["usage"]["completion_tokens"]
    held = post(base_url, "/v1/chat/completions", {**request, "min_tokens": ended_after + 5})
    assert held["usage"]["completion_tokens"] >= ended_after + 5


def test_chat_continues_and_echoes_the_final_message(stack: tuple[str, str]) -> None:
    _mode, base_url = stack
    body = post(
        base_url,
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": "The capital of France is"},
            ],
            "add_generation_prompt": False,
            "continue_final_message": True,
            "echo": True,
            "max_tokens": 4,
            "temperature": 0,
            "return_token_ids": True,
        },
    )
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant" and message["content"].startswith("The capital of France is ")
    assert "Paris" in message["content"]
    # The answer may end (EOS) before max_tokens; its ids are the usage's count.
    assert body["prompt_token_ids"] and 1 <= len(body["choices"][0]["token_ids"]) <= 4
    assert len(body["choices"][0]["token_ids"]) == body["usage"]["completion_tokens"]


def test_batched_chat_answers_each_conversation(stack: tuple[str, str]) -> None:
    _mode, base_url = stack
    conversations = [[{"role": "user", "content": f"Count to {i}."}] for i in (2, 3)]
    body = post(
        base_url, "/v1/chat/completions/batch", {"messages": conversations, "max_tokens": 6, "temperature": 0}
    )
    assert [c["index"] for c in body["choices"]] == [0, 1]
    for conversation, choice in zip(conversations, body["choices"], strict=True):
        # Greedy: each conversation's answer is the one it gets on its own.
        alone = post(
            base_url, "/v1/chat/completions", {"messages": conversation, "max_tokens": 6, "temperature": 0}
        )
        assert choice["message"]["content"] == alone["choices"][0]["message"]["content"]
    assert 2 <= body["usage"]["completion_tokens"] <= 12
