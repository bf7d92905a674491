"""Structured output through VllmEngine: the contract's constraint becomes vLLM's own
StructuredOutputsParams, and what vLLM refuses about it (two kinds at once; an invalid regex or
schema, refused by the engine's input processor when the request is added) is the client's
mistake (InvalidRequest -> INVALID_ARGUMENT -> 400), never an engine failure."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import StructuredOutputsParams

from cleave.common.v1 import common_pb2
from libs.worker.errors import InvalidRequest
from libs.worker.sampling import sampling_kwargs
from libs.worker.vllm_engine import VllmEngine
from libs.worker.vllm_params import engine_args

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Inputs:
    """vLLM's input processor's place: records the SamplingParams it is given, and refuses
    them as vLLM's would."""

    def __init__(self, refuse: str | None = None) -> None:
        self.refuse = refuse
        self.params: list[Any] = []

    async def process_inputs_async(self, request_id: str, prompt: Any, params: Any, **_: Any) -> Any:
        self.params.append(params)
        if self.refuse:
            raise VLLMValidationError(self.refuse)
        raise _Stop  # what happens after input processing is not this test's concern


class _Stop(Exception):
    pass


class _Client:
    resources = SimpleNamespace(engine_dead=False)

    async def get_supported_tasks_async(self) -> tuple[str, ...]:
        return ("generate",)


def engine(inputs: _Inputs) -> VllmEngine:
    parts = SimpleNamespace(
        client=_Client(),
        input_processor=inputs,
        loggers=None,
        renderer=None,
        vllm_config=SimpleNamespace(model_config=None),
    )
    return VllmEngine(parts, stats=None, info=None)  # type: ignore[arg-type]


async def run(llm: _Inputs, spec: common_pb2.StructuredOutput) -> None:
    kwargs = sampling_kwargs(common_pb2.SamplingParams(structured_output=spec), max_tokens=4)
    try:
        async for _ in engine(llm).generate("r", [1, 2], kwargs):
            pass
    except _Stop:
        pass


async def test_the_constraint_reaches_vllm_as_its_structured_outputs_params() -> None:
    llm = _Inputs()
    await run(
        llm, common_pb2.StructuredOutput(json_schema='{"type": "integer"}', disable_any_whitespace=True)
    )
    structured = llm.params[0].structured_outputs
    assert isinstance(structured, StructuredOutputsParams)
    assert structured.json == '{"type": "integer"}' and structured.disable_any_whitespace is True


@pytest.mark.parametrize(
    "spec",
    [
        common_pb2.StructuredOutput(choice=common_pb2.ChoiceList(choices=["a", "b"])),
        common_pb2.StructuredOutput(regex="[0-9]+"),
        common_pb2.StructuredOutput(grammar='root ::= "x"'),
        common_pb2.StructuredOutput(json_object=True, whitespace_pattern=" "),
    ],
)
async def test_every_kind_is_accepted_by_vllms_params(spec: common_pb2.StructuredOutput) -> None:
    llm = _Inputs()
    await run(llm, spec)
    assert not llm.params[0].structured_outputs.all_constraints_none()


async def test_what_the_engine_refuses_about_a_constraint_is_an_invalid_request() -> None:
    llm = _Inputs(refuse="Invalid regex: unterminated group")
    with pytest.raises(InvalidRequest, match="Invalid regex"):
        await run(llm, common_pb2.StructuredOutput(regex="(ab"))


def test_the_engine_wide_config_becomes_vllms_object() -> None:
    settings = {"backend": "xgrammar", "disable_any_whitespace": True}
    config = engine_args({"model": "m", "structured_outputs_config": settings}).structured_outputs_config
    assert (config.backend, config.disable_any_whitespace) == ("xgrammar", True)
    with pytest.raises(ValueError, match="disable_any_whitespace is only supported"):
        engine_args({"model": "m", "structured_outputs_config": {"disable_any_whitespace": True}})


def test_max_logprobs_is_accepted_by_vllms_engine_args_as_given() -> None:
    # -1 is vLLM's "no cap" (ModelConfig.max_logprobs: ge=-1); engine_args passes it through.
    assert engine_args({"model": "m", "max_logprobs": -1}).max_logprobs == -1
    assert engine_args({"model": "m"}).max_logprobs == 20
