"""qaic_disagg's documented prefill/decode launch command, pasted as a user would with only
the model (smollm2) and the device groups (0 / 1) changed, starts a 1p1d stack that answers.
(Its draft-model command is run by test_speculative.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.harness import Service
from tests.e2e.stack import start_gateway_stack, stop_gateway_stack

# Verbatim from the reference's Disaggregated Serving page except --model and device groups;
# its ports too. --max-model-len 11264 is beyond SmolLM2's 8192: the workers use 8192.
REFERENCE_PD_COMMAND = [
    "--model", "smollm2",
    "--prefill-port", "9900",
    "--prefill-device-group", "0",
    "--decode-port", "9800",
    "--decode-device-group", "1",
    "--port", "8000",
    "--prefill-max-num-seqs", "1",
    "--decode-max-num-seqs", "1",
    "--prefill-max-seq-len-to-capture", "256",
    "--decode-max-seq-len-to-capture", "256",
    "--max-model-len", "11264",
    "--prefill-override-qaic-config", "split_retained_state_io:True mxfp6_matmul:True",
    "--decode-override-qaic-config", "split_retained_state_io:True mxfp6_matmul:True",
    "--generation-config", "vllm",
    "--kv-cache-dtype", "mxint8", "-v", "-v", "-v",
]  # fmt: skip


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, str, Path]]:
    cache = tmp_path_factory.mktemp("cache")
    service, base_url = start_gateway_stack("1p1d", cache, *REFERENCE_PD_COMMAND)
    try:
        yield service, base_url, cache / "logs"
    finally:
        stop_gateway_stack(service)


def test_the_reference_pd_command_serves_chat_completions(stack: tuple[Service, str, Path]) -> None:
    _service, base_url, logs = stack
    assert base_url.endswith(":8000")
    with httpx.Client(base_url=base_url, timeout=120) as client:
        (model,) = client.get("/v1/models").json()["data"]
        reply = client.post(
            "/v1/chat/completions",
            json={
                "model": model["id"],
                "temperature": 0,
                "max_tokens": 12,
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
            },
        )
        workers = client.get("/health").json()["workers"]
    assert reply.status_code == 200, reply.text
    assert "Paris" in reply.json()["choices"][0]["message"]["content"]
    # 11264 asked, the model's 8192 used (a warning, not a stopped stack).
    assert model["max_model_len"] == 8192
    assert sorted((w["role"], w["address"].rsplit(":", 1)[1]) for w in workers) == [
        ("decode", "9800"),
        ("prefill", "9900"),
    ]
    # -v -v -v: debug logs; mxint8 without a kvstore: said once, the stack runs.
    prefill_log = (logs / "prefill-0.log").read_text(errors="replace")
    assert "[debug" in prefill_log
    assert prefill_log.count("kv-cache-dtype mxint8") == 1
    assert "exceeds the model's context length" in prefill_log
