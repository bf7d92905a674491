"""Server-wide flags that set a request's defaults, as vLLM's server does: what a stream's
usage reports under --enable-force-include-usage, and --return-tokens-as-token-ids."""

from __future__ import annotations

from typing import Any

import pytest

from libs.gateway.api import completions as app_module
from libs.gateway.api.context import ApiOptions
from libs.gateway.api.openai_api import CompletionRequest
from libs.gateway.api.response_extras import token_id_labels
from libs.gateway.api.responses import TokenizerTexts
from tests.libs.gateway.fakes import FakeTokenizer, ScriptedServing, api_context


def test_the_force_include_usage_flag_overrides_what_a_stream_asked_for() -> None:
    from libs.gateway.api.completions import _stream_options
    from libs.gateway.api.openai_api import StreamOptions

    asked = StreamOptions(include_usage=False)
    assert _stream_options(asked, force_usage=False) is asked
    assert _stream_options(None, force_usage=False) == StreamOptions()
    # vLLM's should_include_usage under --enable-force-include-usage: both, whatever was asked.
    forced = _stream_options(asked, force_usage=True)
    assert forced.include_usage and forced.continuous_usage_stats


@pytest.mark.parametrize(
    ("server", "asked", "as_ids"), [(False, None, False), (True, None, True), (True, False, False)]
)
def test_return_tokens_as_token_ids_defaults_to_the_servers_flag(
    server: bool, asked: bool | None, as_ids: bool
) -> None:
    # vLLM: the request's return_tokens_as_token_ids if set, else --return-tokens-as-token-ids.
    tokenizer: Any = FakeTokenizer()
    pipeline: Any = ScriptedServing([])
    state = api_context(pipeline, tokenizer=tokenizer, options=ApiOptions(return_tokens_as_token_ids=server))
    body = CompletionRequest.model_validate(
        {"model": "m", "prompt": "x", "return_tokens_as_token_ids": asked}
    )
    texts = TokenizerTexts(tokenizer)
    assert (app_module._token_text(state, body, texts) is token_id_labels) is as_ids
