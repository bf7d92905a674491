"""qaic_disagg's documented prefill/decode launch command, pasted as a user would with only
the model (smollm2) and the device groups (0 / 1) changed, starts a 1p1d stack that answers
(tests/e2e/conftest.py: reference_pd_stack, which test_speculative.py then uses as its stack
without speculation; the reference's draft-model command is run there)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.e2e.harness import Service


def test_the_reference_pd_command_serves_chat_completions(
    reference_pd_stack: tuple[Service, str, Path],
) -> None:
    _service, base_url, logs = reference_pd_stack
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
