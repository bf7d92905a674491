from __future__ import annotations

from typing import Any

import pytest

from cleave.common.v1 import common_pb2
from libs.worker.errors import InvalidRequest
from libs.worker.sampling import sampling_kwargs


def test_unset_fields_keep_engine_defaults() -> None:
    kwargs = sampling_kwargs(common_pb2.SamplingParams(), max_tokens=7)
    assert kwargs["max_tokens"] == 7
    assert kwargs["n"] == 1
    for key in ("temperature", "top_p", "top_k", "seed", "logprobs", "prompt_logprobs", "stop_token_ids"):
        assert key not in kwargs


def test_every_field_maps() -> None:
    params = common_pb2.SamplingParams(
        temperature=0.0,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        seed=7,
        n=3,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.1,
        stop_token_ids=[2],
        ignore_eos=True,
        logprobs=2,
        prompt_logprobs=1,
        logit_bias={5: -100.0},
        min_tokens=2,
        skip_special_tokens=True,
        structured_output=common_pb2.StructuredOutput(choice=common_pb2.ChoiceList(choices=["yes", "no"])),
    )
    kwargs = sampling_kwargs(params, max_tokens=10)
    assert kwargs["temperature"] == 0.0
    assert kwargs["top_p"] == pytest.approx(0.9)
    assert kwargs["top_k"] == 40
    assert kwargs["min_p"] == pytest.approx(0.05)
    assert kwargs["seed"] == 7
    assert kwargs["n"] == 3
    assert kwargs["presence_penalty"] == 0.5
    assert kwargs["frequency_penalty"] == -0.5
    assert kwargs["repetition_penalty"] == pytest.approx(1.1)
    assert kwargs["stop_token_ids"] == [2]
    assert kwargs["ignore_eos"] is True
    assert (kwargs["logprobs"], kwargs["prompt_logprobs"]) == (2, 1)
    assert kwargs["logit_bias"] == {5: -100.0}
    assert kwargs["min_tokens"] == 2
    assert kwargs["structured_outputs"] == {"choice": ["yes", "no"]}
    assert kwargs["detokenize"] is False


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (common_pb2.SamplingParams(temperature=-1), "temperature must be >= 0"),
        (common_pb2.SamplingParams(top_p=0), r"top_p must be in \(0, 1\]"),
        (common_pb2.SamplingParams(presence_penalty=3), r"presence_penalty must be in \[-2, 2\]"),
        (common_pb2.SamplingParams(logprobs=-1), "logprobs must be >= 0"),
        (common_pb2.SamplingParams(n=-2), r"n must be in \[1, 1024\]"),
        (common_pb2.SamplingParams(n=2**31 - 1), r"n must be in \[1, 1024\]"),
    ],
)
def test_out_of_range_values_are_invalid(params: common_pb2.SamplingParams, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        sampling_kwargs(params, max_tokens=1)


def test_generation_config_defaults_fill_only_what_the_request_left_unset() -> None:
    # What vLLM's get_diff_sampling_param returns for a model with a generation_config.json
    # under --generation-config auto (max_tokens and penalties are the gateway's business).
    defaults = {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05, "max_tokens": 99}
    unset = sampling_kwargs(common_pb2.SamplingParams(), max_tokens=7, defaults=defaults)
    assert (unset["temperature"], unset["top_p"], unset["top_k"], unset["repetition_penalty"]) == (
        0.6,
        0.9,
        20,
        1.05,
    )
    assert unset["max_tokens"] == 7
    given = sampling_kwargs(
        common_pb2.SamplingParams(temperature=0.0, top_k=5), max_tokens=7, defaults=defaults
    )
    assert (given["temperature"], given["top_k"], given["top_p"]) == (0.0, 5, 0.9)
    assert "temperature" not in sampling_kwargs(common_pb2.SamplingParams(), max_tokens=7, defaults={})


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (common_pb2.StructuredOutput(json_schema='{"type": "object"}'), {"json": '{"type": "object"}'}),
        (common_pb2.StructuredOutput(json_object=True), {"json_object": True}),
        (common_pb2.StructuredOutput(regex="[a-z]+"), {"regex": "[a-z]+"}),
        (common_pb2.StructuredOutput(grammar='root ::= "a"'), {"grammar": 'root ::= "a"'}),
        (common_pb2.StructuredOutput(structural_tag='{"type": "x"}'), {"structural_tag": '{"type": "x"}'}),
        (
            common_pb2.StructuredOutput(
                json_object=True,
                disable_any_whitespace=True,
                disable_additional_properties=True,
                whitespace_pattern=" ?",
            ),
            {
                "json_object": True,
                "disable_any_whitespace": True,
                "disable_additional_properties": True,
                "whitespace_pattern": " ?",
            },
        ),
    ],
)
def test_structured_output_maps_to_vllms_names(
    spec: common_pb2.StructuredOutput, expected: dict[str, Any]
) -> None:
    kwargs = sampling_kwargs(common_pb2.SamplingParams(structured_output=spec), max_tokens=4)
    assert kwargs["structured_outputs"] == expected


def test_no_structured_output_sets_none() -> None:
    assert "structured_outputs" not in sampling_kwargs(common_pb2.SamplingParams(), max_tokens=4)


def test_vllm_xargs_may_not_carry_the_keys_the_worker_sets_for_its_engine() -> None:
    json_text = '{"cleave_moved_penalties": 1, "k": 2}'
    with pytest.raises(InvalidRequest, match="reserved: \\['cleave_moved_penalties'\\]"):
        sampling_kwargs(common_pb2.SamplingParams(extra_args_json=json_text), max_tokens=4)
