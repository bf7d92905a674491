"""vLLM's engine-core outputs → the worker's EngineSteps, one engine step at a time.

vLLM's engine-core client hands over, after each engine step, one `EngineCoreOutputs`: every
running request's new token ids, logprob arrays, finish reason and KV-transfer parameters, and
the scheduler's statistics. `OutputRouter` turns each request's part into one `EngineStep` on
that request's own stream, and feeds vLLM's stat loggers (vLLM's `IterationStats`, built as
vLLM's own output processor builds it), so every `vllm:*` metric the worker exports stays.

Why not vLLM's `AsyncLLM` client: its output processor builds a `RequestOutput`, a
`CompletionOutput` and Logprob dicts per request per step and wakes a collector per request,
work the worker then undid to make its messages (docs/benchmarks.md, issue 30: it was most
of the worker shell's CPU per token). Here the engine does not detokenize (the gateway does),
so a step's work per request is a tuple of token ids and, only when asked for, logprobs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import structlog
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
from vllm.v1.engine.parallel_sampling import ParentRequest
from vllm.v1.metrics.stats import IterationStats, LoRARequestStates, RequestStateStats

from libs.worker.engine import EngineStep, SequenceDelta, TokenLogprob
from libs.worker.vllm_logprobs import prompt_logprobs, sample_logprobs

log = structlog.get_logger(__name__)


class RequestStream:
    """One client request's steps, for the one task that reads them (`VllmEngine.generate`).

    A request with n > 1 runs as n vLLM requests (vLLM's ParentRequest names them and sets
    their seeds); their steps all land here, each with its sequence index."""

    def __init__(
        self,
        *,
        prompt_len: int,
        num_sequences: int,
        remote_cached_tokens: int | None,
        expanded_prompt: tuple[int, ...] | None,
    ) -> None:
        self.prompt_len = prompt_len
        self.open = num_sequences
        self.num_cached_tokens = 0
        self.remote_cached_tokens = remote_cached_tokens
        self.expanded_prompt = expanded_prompt  # images: sent on the first step only
        self.prompt_logprobs_sent = False
        self.pending: list[EngineStep] = []
        self.error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def put(self, step: EngineStep) -> None:
        self.pending.append(step)
        self._wake()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self._wake()

    async def wait(self) -> None:
        """Until a step or an error is ready (one wake-up per engine step, at most)."""
        if self.pending or self.error is not None:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def take(self) -> list[EngineStep]:
        steps, self.pending = self.pending, []
        return steps

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class _Sequence:
    """One vLLM request: a sequence of a client request."""

    __slots__ = (
        "external_id",
        "index",
        "max_tokens",
        "num_logprobs",
        "num_prompt_logprobs",
        "parent",
        "prefilling",
        "prompt_logprobs",
        "stats",
        "stream",
    )  # fmt: skip

    def __init__(
        self,
        stream: RequestStream,
        index: int,
        external_id: str,
        parent: ParentRequest | None,
        *,
        max_tokens: int | None,
        num_logprobs: int | None,
        num_prompt_logprobs: int | None,
        arrival_time: float,
    ) -> None:
        self.stream = stream
        self.index = index
        self.external_id = external_id
        self.parent = parent
        self.max_tokens = max_tokens
        self.num_logprobs = num_logprobs
        self.prefilling = True
        # vLLM's convention: the first prompt token has no logprob. Chunked prefill sends the
        # rest in pieces; they go out together with the sequence's first token.
        self.num_prompt_logprobs = num_prompt_logprobs
        self.prompt_logprobs: list[TokenLogprob | None] | None = (
            None if num_prompt_logprobs is None else [None]
        )
        self.stats = RequestStateStats(arrival_time=arrival_time)


class OutputRouter:
    """Reads the engine-core client's outputs in one task and routes each to its stream."""

    def __init__(self, client: Any, logger_manager: Any, renderer: Any) -> None:
        self._client = client
        self._loggers = logger_manager
        self._renderer = renderer
        self._lora_states = LoRARequestStates(log_stats=True)
        self._sequences: dict[str, _Sequence] = {}  # by vLLM's (internal) request id
        self._task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None

    def add(
        self,
        stream: RequestStream,
        requests: Sequence[tuple[int, Any]],
        parent: ParentRequest | None,
        *,
        external_id: str,
    ) -> None:
        """Routes the outputs of `requests` ((sequence index, EngineCoreRequest)) to `stream`."""
        self._ensure_running()
        for index, request in requests:
            params = request.sampling_params
            self._sequences[request.request_id] = _Sequence(
                stream,
                index,
                external_id,
                parent,
                max_tokens=params.max_tokens,
                num_logprobs=params.logprobs,
                num_prompt_logprobs=params.prompt_logprobs,
                arrival_time=request.arrival_time,
            )

    def forget(self, request_ids: Sequence[str]) -> list[str]:
        """Stops routing these requests; returns those still running in the engine."""
        return [rid for rid in request_ids if self._sequences.pop(rid, None) is not None]

    @property
    def stopped(self) -> bool:
        return self._task is not None and self._task.done()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _ensure_running(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="vllm-output-router")

    async def _run(self) -> None:
        try:
            while True:
                outputs: EngineCoreOutputs = await self._client.get_output_async()
                iteration = IterationStats() if outputs.outputs else None
                for output in outputs.outputs:
                    sequence = self._sequences.get(output.request_id)
                    if sequence is not None:  # otherwise its reader left and aborted it
                        self._route(sequence, output, outputs.timestamp, iteration)
                self._loggers.record(
                    engine_idx=outputs.engine_index,
                    scheduler_stats=outputs.scheduler_stats,
                    iteration_stats=iteration,
                    mm_cache_stats=self._renderer.stat_mm_cache(),
                )
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # EngineDeadError, or the client's own failure
            log.error("the engine's output stream failed", error=repr(error))
            self.error = error
            for sequence in list(self._sequences.values()):
                sequence.stream.fail(error)
            self._sequences.clear()

    def _route(
        self,
        sequence: _Sequence,
        output: EngineCoreOutput,
        timestamp: float,
        iteration: IterationStats | None,
    ) -> None:
        stream = sequence.stream
        if iteration is not None:
            iteration.update_from_output(
                output, timestamp, sequence.prefilling, sequence.stats, self._lora_states, None
            )
        if sequence.prefilling:
            # What vLLM's output processor reports as the request's cached prompt tokens.
            if output.prefill_stats is not None:
                stream.num_cached_tokens = output.prefill_stats.num_cached_tokens
            if stream.remote_cached_tokens is not None:
                stream.num_cached_tokens = stream.remote_cached_tokens
            sequence.prefilling = False
        if output.new_prompt_logprobs_tensors is not None and sequence.prompt_logprobs is not None:
            sequence.prompt_logprobs.extend(
                prompt_logprobs(output.new_prompt_logprobs_tensors, sequence.num_prompt_logprobs or 0)
            )
        tokens = output.new_token_ids
        finish = output.finish_reason
        if not tokens and finish is None and output.kv_transfer_params is None:
            return  # a prefill chunk: nothing for the reader yet
        logprobs: tuple[TokenLogprob, ...] = ()
        if output.new_logprobs is not None and sequence.num_logprobs is not None:
            logprobs = sample_logprobs(output.new_logprobs, sequence.num_logprobs)
        if finish is not None:
            self._sequences.pop(output.request_id, None)
            stream.open -= 1
            if iteration is not None:
                self._finished(sequence, finish, iteration)
        step_prompt_logprobs = None
        if sequence.prompt_logprobs is not None and not stream.prompt_logprobs_sent:
            step_prompt_logprobs = tuple(sequence.prompt_logprobs)
            stream.prompt_logprobs_sent = True
        expanded, stream.expanded_prompt = stream.expanded_prompt, None
        stream.put(
            EngineStep(
                sequences=(
                    SequenceDelta(
                        index=sequence.index,
                        token_ids=tuple(tokens),
                        logprobs=logprobs,
                        finish_reason=None if finish is None else str(finish),
                        stop_token_id=output.stop_reason if isinstance(output.stop_reason, int) else None,
                    ),
                ),
                finished=stream.open == 0,
                num_prompt_tokens=stream.prompt_len,
                num_cached_tokens=stream.num_cached_tokens,
                kv_transfer_params=output.kv_transfer_params,
                prompt_logprobs=step_prompt_logprobs,
                prompt_token_ids=expanded,
            )
        )

    def _finished(self, sequence: _Sequence, finish: FinishReason, iteration: IterationStats) -> None:
        iteration.update_from_finished_request(
            finish_reason=finish,
            request_id=sequence.external_id,
            num_prompt_tokens=sequence.stream.prompt_len,
            max_tokens_param=sequence.max_tokens,
            req_stats=sequence.stats,
            num_cached_tokens=sequence.stream.num_cached_tokens,
        )
        ParentRequest.observe_finished_request(
            sequence.parent, iteration, sequence.stats.num_generation_tokens
        )
