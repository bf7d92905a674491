"""The grammar hook for moved structured-output requests: the grammar vLLM compiles is
advanced over the tokens the request generated before it moved, before the scheduler may use
it; tokens it rejects fail the request; any other request is left as vLLM made it."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from vllm import SamplingParams
from vllm.config import SchedulerConfig
from vllm.utils.import_utils import resolve_obj_by_qualname
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.structured_output.request import StructuredOutputRequest

from libs.worker.sampling import RESERVED_EXTRA_ARGS_PREFIX
from libs.worker.vllm_grammar_prefix import GRAMMAR_PREFIX, prime, scheduler_for


class _Grammar:
    def __init__(self, accepts: bool = True) -> None:
        self.accepts = accepts
        self.accepted: list[tuple[str, list[int]]] = []

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        self.accepted.append((request_id, tokens))
        return self.accepts


def request(extra: dict[str, Any] | None) -> Any:
    params = SamplingParams(extra_args=extra)
    structured = StructuredOutputRequest.__new__(StructuredOutputRequest)
    structured.grammar = Future()
    return SimpleNamespace(request_id="r-x", sampling_params=params, structured_output_request=structured)


def test_the_grammar_starts_after_the_moved_tokens_once_compiled() -> None:
    assert GRAMMAR_PREFIX.startswith(RESERVED_EXTRA_ARGS_PREFIX)  # no client can send it
    moved = request({GRAMMAR_PREFIX: [5, 6, 7]})
    compiling = moved.structured_output_request._grammar
    prime(moved)
    assert not moved.structured_output_request.is_grammar_ready  # still compiling
    grammar = _Grammar()
    compiling.set_result(grammar)
    assert moved.structured_output_request.grammar is grammar
    assert grammar.accepted == [("r-x", [5, 6, 7])]


def test_tokens_the_grammar_rejects_fail_the_request() -> None:
    moved = request({GRAMMAR_PREFIX: [9]})
    compiling = moved.structured_output_request._grammar
    prime(moved)
    compiling.set_result(_Grammar(accepts=False))
    failure = moved.structured_output_request.grammar
    assert isinstance(failure, ValueError) and "do not fit" in str(failure)


@pytest.mark.parametrize("extra", [None, {"other": 1}])
def test_other_requests_keep_vllms_grammar(extra: dict[str, Any] | None) -> None:
    plain = request(extra)
    compiling = plain.structured_output_request._grammar
    prime(plain)
    assert plain.structured_output_request._grammar is compiling


@pytest.mark.parametrize(("async_scheduling", "base"), [(True, AsyncScheduler), (False, Scheduler)])
def test_the_hook_keeps_vllms_choice_of_scheduler(async_scheduling: bool, base: type) -> None:
    name = scheduler_for(async_scheduling)
    assert issubclass(resolve_obj_by_qualname(name), base)
    config = SchedulerConfig(max_model_len=2048, is_encoder_decoder=False, scheduler_cls=name)
    assert config.get_scheduler_cls() is resolve_obj_by_qualname(name)
