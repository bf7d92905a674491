"""A moved structured-output request's grammar, started where the failed worker left it.

vLLM's gap: a request's structured-output grammar (xgrammar's matcher) always starts at the
beginning of the constraint, and vLLM has no way to start it from tokens the request did not
generate itself. A request that moved to this worker after its first worker failed
(libs/gateway/serving/migration.py) has its generated tokens at the end of its prompt, so a
fresh grammar would accept a second document after half of one.

The smallest hook that fills it: vLLM's own schedulers, with one addition when a request is
added: a request whose `extra_args` carry `GRAMMAR_PREFIX` gets its grammar advanced over
those tokens as soon as vLLM has compiled it, before the scheduler may use it. Tokens the
grammar rejects fail the request as a grammar that does not compile does. The classes live
in the engine-core process (vLLM imports `scheduler_cls` there); the worker sets them in
`vllm_engine.py`. Nothing else of the scheduler changes.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

GRAMMAR_PREFIX = "cleave_grammar_prefix"


def prime(request: Any) -> None:
    """Makes `request`'s grammar (a vLLM Request's, compiled or still compiling) start after
    the tokens in its GRAMMAR_PREFIX; nothing for any other request."""
    params = request.sampling_params
    extra = params.extra_args if params is not None else None
    structured = request.structured_output_request
    if not extra or GRAMMAR_PREFIX not in extra or structured is None:
        return
    prefix = [int(token) for token in extra[GRAMMAR_PREFIX]]
    compiling = structured._grammar  # vLLM's field: a Future until compiled
    primed: Future[Any] = Future()

    def advance(done: Future[Any]) -> None:
        try:
            grammar = done.result()
            if not grammar.accept_tokens(request.request_id, prefix):
                raise ValueError("the tokens generated before the move do not fit the request's grammar")
        except Exception as error:  # the scheduler fails this request alone
            primed.set_exception(error)
            return
        primed.set_result(grammar)

    if isinstance(compiling, Future):
        compiling.add_done_callback(advance)
    else:
        already: Future[Any] = Future()
        already.set_result(compiling)
        advance(already)
    structured.grammar = primed


class PrimingScheduler(Scheduler):
    def add_request(self, request: Any) -> None:
        prime(request)
        super().add_request(request)


class PrimingAsyncScheduler(AsyncScheduler):
    def add_request(self, request: Any) -> None:
        prime(request)
        super().add_request(request)


def scheduler_for(async_scheduling: bool) -> str:
    """vLLM's choice of scheduler (SchedulerConfig.get_scheduler_cls), with the hook: by name,
    which the engine-core process resolves (it is started with spawn on CPU)."""
    chosen = PrimingAsyncScheduler if async_scheduling else PrimingScheduler
    return f"{__name__}.{chosen.__name__}"
