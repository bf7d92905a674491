"""Speculative decoding on the decode worker of a real 1p1d stack (float32 SmolLM2): greedy
output with n-gram and with a draft model (SmolLM2 drafting for itself) is the output without
speculation, and the decode worker reports accepted draft tokens. The draft-model stack is
qaic_disagg's documented launch command, pasted with only the model and the device groups
changed; the stack without speculation is the one its prefill/decode command started for
test_reference_commands.py (tests/e2e/conftest.py: reference_pd_stack). CI runs 4 repetitive
completions and 4 chats per stack (most of each stack's time is its start);
`--test_env=CLEAVE_E2E_SPEC_PROMPTS=10` runs all 20.

One stack at a time (two would not fit a 2-core machine), prompts one at a time: every batch
holds one request in all three stacks, whatever their max-num-seqs, so the same prompt meets
the same kernels. Each run reads the gateway's re-exported worker metrics, then stops its stack.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.harness import Service
from tests.e2e.prompts import CHAT
from tests.e2e.stack import start_gateway_stack, stop_gateway_stack

MAX_TOKENS = 40
# Continuations an n-gram drafter can predict from the prompt itself.
REPETITIVE = [
    "Monday Tuesday Wednesday Thursday Friday Saturday Sunday " * 3,
    "January February March April May June July August September October November December " * 2,
    "The cat sat on the mat. The dog sat on the log. " * 4,
    "red green blue, red green blue, red green blue, red green blue, ",
    "for i in range(10):\n    print(i)\n" * 4,
    "A B C D E F G H I J K L M N O P Q R S T U V W X Y Z " * 2,
    "Row, row, row your boat, gently down the stream. Merrily, merrily, merrily, merrily, "
    "life is but a dream. " * 2,
    "one two three four five, one two three four five, one two three four five, ",
    '{"id": 1, "name": "alpha"}\n{"id": 2, "name": "beta"}\n{"id": 3, "name": "gamma"}\n{"id": 4, "name":',
    "Repeat this sentence forever: I like green apples. I like green apples. I like green apples.",
]
CHATS = CHAT[:10]
PER_KIND = int(os.environ.get("CLEAVE_E2E_SPEC_PROMPTS", "4"))  # of each list, at most 10
NGRAM = '{"method": "ngram", "num_speculative_tokens": 5}'
# qaic_disagg's documented draft-model launch command (its Disaggregated Serving page) verbatim,
# except --model (smollm2), the device groups (0 / 1) and the draft model (smollm2 itself,
# which shares the target's tokenizer as a draft must). Its ports are the reference's too.
REFERENCE_DRAFT_COMMAND = [
    "--model", "smollm2",
    "--prefill-port", "9900",
    "--prefill-device-group", "0",
    "--decode-port", "9800",
    "--decode-device-group", "1",
    "--port", "8000",
    "--prefill-max-num-seqs", "1",
    "--decode-max-num-seqs", "4",
    "--max-model-len", "2048",
    "--prefill-override-qaic-config", "mxfp6_matmul:True",
    "--decode-override-qaic-config", "mxfp6_matmul:True num_cores:10",
    "--decode-speculative-config",
    '{"speculative_model":"smollm2","num_speculative_tokens":3,'
    '"draft_override_qaic_config":{"device_group":[0],"num_cores":6}}',
    "--kv-cache-dtype", "mxint8",
    "--generation-config", "vllm",
]  # fmt: skip
# The draft command's shape, for the n-gram stack.
DRAFT_SHAPE = ["--prefill-max-num-seqs", "1", "--decode-max-num-seqs", "4", "--max-model-len", "2048"]


@dataclass(frozen=True)
class Run:
    outputs: list[tuple[str, int]]  # (text, completion tokens) per prompt, in order
    spec_decode: dict[str, float]  # the decode worker's counters from the gateway's /metrics
    chat_reply: str


def run_stack(cache_dir: Path, *flags: str) -> Run:
    service, base_url = start_gateway_stack("1p1d", cache_dir, *flags)
    try:
        return run_prompts(base_url, expect_drafts="--decode-speculative-config" in flags)
    finally:
        stop_gateway_stack(service)


def run_prompts(base_url: str, *, expect_drafts: bool) -> Run:
    with httpx.Client(base_url=base_url, timeout=300) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        outputs = [_complete(client, model, prompt) for prompt in REPETITIVE[:PER_KIND]]
        outputs += [_chat(client, model, text) for text in CHATS[:PER_KIND]]
        reply = _chat(client, model, "What is the capital of France?")[0]
        spec = _spec_decode_metrics(client, expect_drafts=expect_drafts)
    return Run(outputs, spec, reply)


def _complete(client: httpx.Client, model: str, prompt: str) -> tuple[str, int]:
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    reply = client.post("/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    return data["choices"][0]["text"], data["usage"]["completion_tokens"]


def _chat(client: httpx.Client, model: str, text: str) -> tuple[str, int]:
    messages = [{"role": "user", "content": text}]
    body = {"model": model, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}
    reply = client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    return data["choices"][0]["message"]["content"], data["usage"]["completion_tokens"]


def _spec_decode_metrics(client: httpx.Client, *, expect_drafts: bool) -> dict[str, float]:
    """The decode worker's spec-decode counters; the gateway polls worker stats every second."""
    deadline = time.monotonic() + (15 if expect_drafts else 3)
    values: dict[str, float] = {}
    while time.monotonic() < deadline:
        values = {}
        for family in text_string_to_metric_families(client.get("/metrics").text):
            if family.name.startswith("cleave_gateway_worker_spec_decode_"):
                for sample in family.samples:
                    if sample.labels.get("role") == "decode":
                        name = sample.name.removeprefix("cleave_gateway_worker_spec_decode_")
                        values[name.removesuffix("_total")] = sample.value
        if values.get("accepted_tokens", 0) > 0:
            break
        time.sleep(1)
    return values


@pytest.fixture(scope="module")
def plain(reference_pd_stack: tuple[Service, str, Path]) -> Run:
    service, base_url, _logs = reference_pd_stack
    try:
        return run_prompts(base_url, expect_drafts=False)
    finally:
        stop_gateway_stack(service)


@pytest.fixture(scope="module")
def ngram(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_stack(tmp_path_factory.mktemp("ngram"), *DRAFT_SHAPE, "--decode-speculative-config", NGRAM)


@pytest.fixture(scope="module")
def draft(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_stack(tmp_path_factory.mktemp("draft"), *REFERENCE_DRAFT_COMMAND)


def _report(name: str, run: Run, plain: Run) -> None:
    same = sum(a == b for a, b in zip(run.outputs, plain.outputs, strict=True))
    spec = run.spec_decode
    print(
        f"{name}: {same}/{len(plain.outputs)} outputs identical; drafts {spec.get('drafts', 0):.0f}, "
        f"draft tokens {spec.get('draft_tokens', 0):.0f}, accepted {spec.get('accepted_tokens', 0):.0f}, "
        f"acceptance rate {spec.get('acceptance_rate', 0):.2f}, "
        f"mean accepted length {spec.get('mean_accepted_length', 0):.2f}"
    )


def test_without_speculation_the_decode_worker_reports_no_drafts(plain: Run) -> None:
    assert plain.spec_decode.get("drafts", 0) == 0
    assert all(tokens > 0 for _, tokens in plain.outputs)


def test_ngram_output_is_the_plain_output_and_drafts_are_accepted(ngram: Run, plain: Run) -> None:
    _report("ngram", ngram, plain)
    for i, (got, want) in enumerate(zip(ngram.outputs, plain.outputs, strict=True)):
        assert got == want, f"prompt {i}: n-gram {got!r} != plain {want!r}"
    assert ngram.spec_decode["accepted_tokens"] > 0
    assert 0 < ngram.spec_decode["acceptance_rate"] <= 1
    assert ngram.spec_decode["mean_accepted_length"] > 1


# vLLM's NIXL handoff needs the same KV layers on both sides, and a decode engine with a draft
# model has the draft's layers too, so the local stack gives the prefill worker the draft as
# well (it computes the draft's prompt KV; libs/stack/local.py).
def test_reference_draft_model_command_answers_with_the_plain_output(draft: Run, plain: Run) -> None:
    _report("draft model", draft, plain)
    assert "Paris" in draft.chat_reply
    for i, (got, want) in enumerate(zip(draft.outputs, plain.outputs, strict=True)):
        assert got == want, f"prompt {i}: draft model {got!r} != plain {want!r}"
    # SmolLM2 drafting for itself: greedy drafts are the target's own choices.
    assert draft.spec_decode["accepted_tokens"] > 0
    assert draft.spec_decode["acceptance_rate"] > 0.5
