"""`--speculative-config`: both qaic_disagg forms become vLLM's SpeculativeConfig fields; every
bad key or value is one ConfigError that names it; the stats carry both ratios."""

from __future__ import annotations

import json

import pytest

from libs.config.errors import ConfigError
from libs.worker.speculative import (
    Method,
    parse_speculative_config,
    spec_decode_stats,
    vllm_speculative_kwargs,
)

# The reference's draft-model form, as its launch command spells it.
REFERENCE_DRAFT = (
    '{"speculative_model":"meta-llama/Llama-3.2-1B-Instruct","num_speculative_tokens":3,'
    '"draft_override_qaic_config":{"device_group":[0],"num_cores":6}}'
)


def test_ngram_form_passes_through_as_vllm_spells_it() -> None:
    spec = parse_speculative_config('{"method":"ngram","num_speculative_tokens":5}')
    assert spec.method is Method.NGRAM and spec.draft_model is None
    assert vllm_speculative_kwargs(spec) == {"method": "ngram", "num_speculative_tokens": 5}


def test_draft_model_form_becomes_vllm_model_and_method() -> None:
    spec = parse_speculative_config(REFERENCE_DRAFT)
    assert vllm_speculative_kwargs(spec) == {
        "method": "draft_model",
        "model": "meta-llama/Llama-3.2-1B-Instruct",
        "num_speculative_tokens": 3,
    }
    # Kept aside for the Cloud AI plugin, not given to vLLM's SpeculativeConfig.
    assert spec.draft_override_qaic_config == {"device_group": [0], "num_cores": 6}
    assert spec.draft_device_group == (0,)


def test_vllm_spelling_and_vllm_0x_ngram_spelling_are_accepted() -> None:
    draft = parse_speculative_config('{"model": "/m/draft", "num_speculative_tokens": 2}')
    assert vllm_speculative_kwargs(draft)["model"] == "/m/draft"
    old = parse_speculative_config(
        '{"speculative_model": "[ngram]", "num_speculative_tokens": 4, "ngram_prompt_lookup_max": 3}'
    )
    assert vllm_speculative_kwargs(old) == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_max": 3,
    }


def test_resolved_draft_path_round_trips_through_json() -> None:
    spec = parse_speculative_config(REFERENCE_DRAFT).with_draft_model("/cache/llama-1b")
    again = parse_speculative_config(spec.to_json())
    assert again == spec and json.loads(spec.to_json())["speculative_model"] == "/cache/llama-1b"
    ngram = parse_speculative_config(
        '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2}'
    )
    assert parse_speculative_config(ngram.to_json()) == ngram


def test_device_group_may_use_the_device_group_flag_syntax() -> None:
    spec = parse_speculative_config(
        '{"speculative_model": "m", "num_speculative_tokens": 3, "draft_override_qaic_config": {"device_group": "2..3"}}'
    )
    assert spec.draft_device_group == (2, 3)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"method": "ngram", "num_speculative_tokens": 0}', r"key 'num_speculative_tokens': got 0; expected a positive"),
        ('{"method": "ngram", "num_speculative_tokens": "5"}', r"key 'num_speculative_tokens': got '5'"),
        ('{"method": "ngram", "num_speculative_tokens": true}', r"key 'num_speculative_tokens': got True"),
        ('{"method": "ngram"}', r"expected the key 'num_speculative_tokens' too"),
        ('{"method": "ngram", "num_speculative_tokens": 5, "draft_tokens": 1}', r"key 'draft_tokens': got 1; expected one of"),
        ('{"method": "eagle", "num_speculative_tokens": 5}', r"key 'method': got 'eagle'; expected 'ngram' or 'draft_model'"),
        ('{"num_speculative_tokens": 5}', r"expected the key 'method'"),
        ('{"method": "draft_model", "num_speculative_tokens": 5}', r"expected the key 'speculative_model' too"),
        ('{"method": "ngram", "speculative_model": "m", "num_speculative_tokens": 5}', r"key 'speculative_model': got 'm'"),
        ('{"speculative_model": "", "num_speculative_tokens": 5}', r"key 'speculative_model': got ''"),
        ('{"speculative_model": "a", "model": "b", "num_speculative_tokens": 5}', r"key 'model': got 'b'; expected not both"),
        ('{"speculative_model": "m", "num_speculative_tokens": 3, "prompt_lookup_max": 2}', r"key 'prompt_lookup_max'.*'ngram' only"),
        ('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4, "prompt_lookup_max": 2}',
         r"key 'prompt_lookup_min': got 4; expected at most"),
        ('{"method": "ngram", "num_speculative_tokens": 3, "draft_override_qaic_config": {}}',
         r"key 'draft_override_qaic_config'.*n-gram has no draft"),
        ('{"speculative_model": "m", "num_speculative_tokens": 3, "draft_override_qaic_config": [0]}',
         r"key 'draft_override_qaic_config': got \[0\]; expected a JSON object"),
        ('{"speculative_model": "m", "num_speculative_tokens": 3, "draft_override_qaic_config": {"device_group": [-1]}}',
         r"key 'draft_override_qaic_config.device_group': got \[-1\]"),
        ('{"speculative_model": "m", "num_speculative_tokens": 3, "draft_override_qaic_config": {"device_group": "x"}}',
         r"key 'draft_override_qaic_config.device_group': got 'x'"),
        ("[1, 2]", r"--speculative-config: got '\[1, 2\]'; expected a JSON object"),
        ("{method: ngram}", r"expected a JSON object \(Expecting property name"),
    ],
)  # fmt: skip
def test_each_bad_key_or_value_is_one_error_naming_it(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        parse_speculative_config(text)
    assert str(error.value).startswith("--speculative-config")


def test_the_flag_name_is_the_callers() -> None:
    with pytest.raises(ConfigError, match=r"^--decode-speculative-config key 'num_speculative_tokens'"):
        parse_speculative_config(
            '{"method": "ngram", "num_speculative_tokens": -1}', "--decode-speculative-config"
        )


def test_stats_carry_acceptance_rate_and_mean_accepted_length() -> None:
    stats = spec_decode_stats({"drafts": 10, "draft_tokens": 50, "accepted_tokens": 20})
    assert (stats.drafts, stats.draft_tokens, stats.accepted_tokens) == (10, 50, 20)
    assert stats.acceptance_rate == pytest.approx(0.4)
    assert stats.mean_accepted_length == pytest.approx(3.0)
    empty = spec_decode_stats({})
    assert empty.acceptance_rate == 0 and empty.mean_accepted_length == 0
