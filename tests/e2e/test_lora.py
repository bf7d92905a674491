"""LoRA adapters through the real stacks (SmolLM2, float32) against vLLM's own LoRA serving.

The test adapter (libs/models/tiny_lora.py) is served as `smol-lora` by test_vllm_api's 1p1d and pd
stacks. A request naming it gets, token for token, the greedy output vLLM's offline `LLM`
gives with the same adapter (LoRARequest), which is not the base model's; with 1p1d the
prefill worker computes the prompt under the adapter and the decode worker continues under it.

KV is never shared across the adapter and the base model: each prompt is sent under one and
then under the other on the same stack, so the second finds the first's blocks in the workers'
prefix caches if they were keyed by tokens alone, and its output would then leave vLLM's (the
adapter changes v_proj, so the KV itself differs).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import LORA_MAX_TOKENS, LORA_NAME, lora_prompts
from tests.e2e.harness import Service
from tests.e2e.reference_vllm import ReferenceRun

# lora_prompts()[0] is sent under the adapter then the base model, [1] the other way round.
ORDERS = (("adapter", "base"), ("base", "adapter"))


@pytest.fixture(scope="module")
def reference(lora_reference_run: ReferenceRun) -> dict[str, list[list[int]]]:
    """vLLM's greedy tokens for each of lora_prompts(): from the base model, and under the adapter."""
    outputs = lora_reference_run.outputs()
    count = len(ORDERS)
    by_model = {"base": outputs[:count], "adapter": outputs[count:]}
    for base, adapted in zip(by_model["base"], by_model["adapter"], strict=True):
        assert base != adapted, (
            "the test adapter must change the greedy output, or these checks prove nothing"
        )
    return by_model


def complete(base_url: str, model: str, prompt: list[int]) -> dict[str, object]:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": LORA_MAX_TOKENS,
        "temperature": 0,
        "return_token_ids": True,
    }
    response = httpx.post(f"{base_url}/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return dict(response.json())


@pytest.mark.parametrize("mode", ["1p1d", "pd"])
def test_the_adapter_answers_as_vllms_lora_serving_and_never_shares_kv_with_the_base_model(
    mode: str,
    api_stacks: dict[str, tuple[Service, str]],
    reference: dict[str, list[list[int]]],
) -> None:
    base_url = api_stacks[mode][1]
    base_model = httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["id"]
    names = {"base": base_model, "adapter": LORA_NAME}
    for index, (prompt, order) in enumerate(zip(lora_prompts(), ORDERS, strict=True)):
        for which in order:
            answer = complete(base_url, names[which], prompt)
            choice = answer["choices"][0]  # type: ignore[index]
            assert choice["token_ids"] == reference[which][index], (mode, index, which)
            assert answer["model"] == names[which]  # vLLM names the adapter in its answers


def test_models_lists_the_adapter_under_its_base_model(api_stacks: dict[str, tuple[Service, str]]) -> None:
    cards = httpx.get(f"{api_stacks['1p1d'][1]}/v1/models", timeout=10).json()["data"]
    base, adapter = cards
    assert adapter["id"] == LORA_NAME and adapter["parent"] == base["id"]
    assert Path(adapter["root"]).name == LORA_NAME  # the adapter's folder, as vLLM shows it


def test_an_unknown_adapter_is_vllms_404(api_stacks: dict[str, tuple[Service, str]]) -> None:
    body = {"model": "no-such-adapter", "prompt": "Hello", "max_tokens": 2}
    response = httpx.post(f"{api_stacks['1p1d'][1]}/v1/completions", json=body, timeout=30)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"
