"""A request's latencies as the client sees them, recorded as the gateway's own metrics
(`cleave_gateway_*`) and under vLLM's names (libs/gateway/common/vllm_metrics.py)."""

from __future__ import annotations

import time

from libs.gateway.common import metrics, vllm_metrics
from libs.gateway.common.generation import Finished, GenerationSpec, SequenceEvent


class LatencyClock:
    """Time to first token, the gaps between token events, and the whole request.
    `streamed`: the gateway's own TTFT and inter-token histograms count streamed requests
    only (as they always have); vLLM's count every request, as vLLM's server does."""

    def __init__(self, spec: GenerationSpec, started_s: float | None = None, *, streamed: bool) -> None:
        self._model = spec.model
        self._max_tokens = spec.sampling.max_tokens
        self._streamed = streamed
        self._started = time.perf_counter() if started_s is None else started_s
        self._first: float | None = None
        self._last: float | None = None
        self._finish_reason: str | None = None

    def token_event(self, event: SequenceEvent) -> None:
        now_s = time.perf_counter()
        if self._last is None:
            self._first = now_s - self._started
            vllm_metrics.first_token(self._model, self._first)
            if self._streamed:
                metrics.TTFT_SECONDS.observe(self._first)
        else:
            vllm_metrics.inter_token(self._model, now_s - self._last)
            if self._streamed:
                metrics.ITL_SECONDS.observe(now_s - self._last)
        self._last = now_s
        self._finish_reason = event.finish_reason or self._finish_reason

    def finished(self, event: Finished) -> None:
        e2e_s = time.perf_counter() - self._started
        metrics.E2E_SECONDS.observe(e2e_s)
        metrics.COMPLETION_TOKENS.observe(event.completion_tokens)
        vllm_metrics.finished(
            self._model,
            e2e_s=e2e_s,
            ttft_s=self._first,
            prompt_tokens=event.prompt_tokens,
            generation_tokens=event.completion_tokens,
            max_tokens=self._max_tokens,
            finished_reason=self._finish_reason,
        )
