"""use_beam_search through the HTTP app, as vLLM's server answers it: n beams as n choices,
best first, over a table model (tests/libs/gateway/fakes.py TableModel); streams refused."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from libs.gateway.api.app import create_app
from tests.libs.gateway.fakes import FakeTokenizer, TableModel, api_context

pytestmark = pytest.mark.anyio
EOS = 4
TABLE = {
    1: {2: 0.5, 3: 0.4, EOS: 0.1},
    2: {5: 0.3, 6: 0.3, EOS: 0.4},
    3: {5: 0.9, EOS: 0.1},
    5: {EOS: 0.99, 6: 0.01},
}


def client(model: TableModel) -> httpx.AsyncClient:
    pool: Any = object()  # not consulted by completions
    tokenizer: Any = FakeTokenizer(eos_token_ids=[EOS])
    context = api_context(model, workers=pool, tokenizer=tokenizer)
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(context)), base_url="http://gateway"
    )


async def test_completions_with_beam_search_answer_the_beams_best_first() -> None:
    model = TableModel(TABLE)
    body = {"model": "m", "prompt": [1], "n": 2, "max_tokens": 3, "temperature": 0, "use_beam_search": True}
    async with client(model) as http:
        response = await http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert [(c["index"], c["text"], c["finish_reason"]) for c in choices] == [
        (0, " worldé", "stop"),
        (1, ",é", "stop"),
    ]
    assert response.json()["usage"]["completion_tokens"] == 4
    assert all(spec.sampling.max_tokens == 1 for spec in model.specs)


async def test_a_streamed_beam_search_is_vllms_400() -> None:
    body = {"model": "m", "prompt": [1], "n": 2, "stream": True, "use_beam_search": True}
    async with client(TableModel(TABLE)) as http:
        response = await http.post("/v1/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "Streaming is not currently supported with beam search"
