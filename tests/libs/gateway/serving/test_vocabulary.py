"""Token ids a client chose that the model's vocabulary lacks: refused by the gateway before
any worker works on them, a prompt's with vLLM's own message."""

from __future__ import annotations

import pytest

from libs.gateway.common import errors
from libs.gateway.common.generation import check_vocabulary
from tests.libs.gateway.fakes import spec


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([5, 999_999, 70_000], "Token id 999999 is out of vocabulary"),
        ([5, -3, 999_999], "Token id -3 is out of vocabulary"),  # a negative id first, as vLLM
        ([5, 100], "Token id 100 is out of vocabulary"),
    ],
)
def test_a_prompt_id_outside_the_vocabulary_gets_vllms_message(prompt: list[int], message: str) -> None:
    with pytest.raises(errors.ApiError) as raised:
        check_vocabulary(spec(prompt=prompt), 100)
    assert (raised.value.status, raised.value.message, raised.value.param) == (400, message, "prompt")


def test_a_prompt_inside_the_vocabulary_passes() -> None:
    check_vocabulary(spec(prompt=[0, 99]), 100)


def test_other_ids_outside_the_vocabulary_name_their_field() -> None:
    generation = spec(prompt=[1])
    generation.sampling.stop_token_ids.extend([3, 100])
    with pytest.raises(errors.ApiError) as raised:
        check_vocabulary(generation, 100)
    assert raised.value.param == "stop_token_ids" and "100" in raised.value.message
