"""Conditional disaggregation, 1p1d on the mock engine: the gateway's routing is what is tested
(that a prompt computed on the decode worker and one handed off give the same greedy tokens on
vLLM is test_worker_pd's; on the mock their tokens depend only on the context).

One tokenizer, one prefill and one decode worker, and two gateways over them:
`--disagg-policy always` and `conditional`.
Under conditional a short prompt stays on the decode worker (no handoff: the decode worker's
NIXL pull count does not move) and a long one goes through the prefill worker (it does);
both answer, with the greedy text of the always-remote gateway. The decision counter says
which rule decided each.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from libs.config.flags import parse
from libs.gateway.config import GatewayConfig
from libs.tokenization.server_config import TokenizerServerConfig
from libs.tokenization.tokenizer import Tokenizer, TokenizerConfig
from tests.e2e.harness import Service, start, wait_healthy
from tests.e2e.prompts import RAW, question, shared_prefix
from tests.e2e.stack import MOCK_ENGINE, start_worker

THRESHOLD = 128  # --local-prefill-max-tokens for the test: RAW[0] under it, LONG over
LONG_TOKENS = 600
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def gateways(model_dir: Path) -> Iterator[dict[str, str]]:
    services: list[Service] = []
    try:
        tokenizer = start(
            "tokenizer", "services.tokenizer.main", parse(TokenizerServerConfig, ["--model", str(model_dir)])
        )
        services.append(tokenizer)
        prefill = start_worker("prefill", model_dir, *MOCK_ENGINE)
        decode = start_worker("decode", model_dir, *MOCK_ENGINE)
        services += [prefill, decode]

        async def all_healthy() -> None:
            await asyncio.gather(*(wait_healthy(s, timeout_s=600) for s in services))

        asyncio.run(all_healthy())
        common = ["--port", "0", "--tokenizer", tokenizer.address, "--prefill-workers", prefill.address,
                  "--decode-workers", decode.address]  # fmt: skip
        urls = {}
        for policy, extra in (
            ("always", []),
            ("conditional", ["--local-prefill-max-tokens", str(THRESHOLD)]),
        ):
            config = parse(GatewayConfig, [*common, "--disagg-policy", policy, *extra])
            gateway = start(f"gateway-{policy}", "services.gateway.main", config)
            services.append(gateway)
            urls[policy] = gateway.wait_http_ready(120)
        yield urls
    finally:
        for service in reversed(services):
            service.stop()


def complete(url: str, prompt: list[int], max_tokens: int = MAX_TOKENS) -> tuple[str, float]:
    """Greedy completion of token ids; its text and the seconds it took."""
    model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    started = time.monotonic()
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"], time.monotonic() - started


def metric(url: str, name: str, labels: str = "") -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    pattern = rf"^{re.escape(name)}{re.escape(labels)} (\S+)$"
    values = [float(m.group(1)) for m in re.finditer(pattern, text, re.MULTILINE)]
    return sum(values)


def kv_pulls(url: str, at_least: float = 0.0, timeout_s: float = 10.0) -> float:
    """NIXL reads by the decode worker (from the gateway's polled stats, every second)."""
    deadline = time.monotonic() + timeout_s
    while True:
        count = metric(url, "cleave_gateway_worker_kv_pull_seconds_count")
        if count >= at_least or time.monotonic() > deadline:
            return count
        time.sleep(0.5)


def decisions(url: str, outcome: str, reason: str) -> float:
    labels = f'{{outcome="{outcome}",reason="{reason}"}}'
    return metric(url, "cleave_gateway_disagg_decisions_total", labels)


def test_short_prompt_stays_on_decode_long_goes_remote(gateways: dict[str, str], model_dir: Path) -> None:
    tokenizer = Tokenizer.from_config(TokenizerConfig(path=model_dir))
    short = tokenizer.encode(RAW[0])
    long = shared_prefix(tokenizer, seed=11, tokens=LONG_TOKENS) + question(tokenizer, "Which word is first?")
    assert len(short) <= THRESHOLD < len(long)
    always, conditional = gateways["always"], gateways["conditional"]

    expected = {name: complete(always, ids)[0] for name, ids in (("short", short), ("long", long))}
    pulls = kv_pulls(conditional, at_least=2)
    assert pulls >= 2  # the always gateway's two requests were handed off

    text, _ = complete(conditional, short)
    assert text == expected["short"]
    assert decisions(conditional, "local", "short_prompt") == 1
    time.sleep(2.5)  # two polls: a handoff would have shown
    assert kv_pulls(conditional) == pulls, "the short prompt was handed off"

    text, _ = complete(conditional, long)
    assert text == expected["long"]
    assert decisions(conditional, "remote", "long_prompt") == 1
    assert kv_pulls(conditional, at_least=pulls + 1) > pulls, "the long prompt was not handed off"
