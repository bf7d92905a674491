"""Which sequences run in the next engine step, and how many tokens each: vLLM v1's
scheduler (vllm/v1/core/sched/scheduler.py, FCFS policy) without a model behind it.

The rules kept:
- No prefill or decode phase: each sequence has tokens without KV (num_tokens -
  num_computed_tokens) and a step gives each some, within `max_num_batched_tokens` for the
  whole step (chunked prefill: a long prompt takes several steps) and
  `long_prefill_token_threshold` per sequence when set.
- Running sequences first, in admission order; then waiting ones first come first served,
  while fewer than `max_num_seqs` run. A waiting sequence that cannot get its blocks stops
  admission (strict FCFS).
- When a running sequence cannot get blocks, the last admitted running sequence is
  preempted: its blocks are freed, its KV forgotten (recompute: it comes back through
  admission, usually hitting its own blocks in the prefix cache), and it goes to the front
  of the waiting queue. No admission in a step that preempted.
- Admission looks up the prefix cache (never the last token); a decode-side sequence with a
  handoff descriptor counts its uncached prompt tokens as external and waits, with its
  blocks allocated, until the simulated pull has delivered them (then its last prompt token
  is recomputed to get logits, as vLLM does).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from libs.mockengine.kv_manager import KvCacheManager
from libs.mockengine.request import SimRequest, Status


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_seqs: int
    max_num_batched_tokens: int
    long_prefill_token_threshold: int = 0

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be at least 1")


@dataclass(frozen=True)
class ScheduledChunk:
    request: SimRequest
    start: int  # tokens with KV before this step
    num_tokens: int

    @property
    def is_decode(self) -> bool:
        """Computes output tokens only (one per step): what the step-time model calls a
        decode sequence; anything that computes prompt tokens is prefill."""
        return self.start >= self.request.num_prompt_tokens


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[SimRequest] = field(default_factory=list)
    # Decode side: sequences admitted to wait for a KV pull of this many prompt tokens.
    pulls: list[tuple[SimRequest, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks)


@dataclass
class PromptTokenCounts:
    """Cumulative prompt tokens by source (vLLM's PromptTokenStats)."""

    computed: int = 0
    local_cache_hit: int = 0
    external: int = 0


class Scheduler:
    def __init__(self, limits: SchedulerLimits, kv: KvCacheManager) -> None:
        self.limits = limits
        self.kv = kv
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.prompt_tokens = PromptTokenCounts()
        self.num_preemptions = 0

    @property
    def has_work(self) -> bool:
        """Whether a step could make progress (sequences waiting only for a pull cannot)."""
        return bool(self.running) or any(
            r.status is not Status.WAITING_FOR_REMOTE_KV or r.remote_kv_ready for r in self.waiting
        )

    def add(self, request: SimRequest) -> None:
        self.kv.update_hashes(request)
        self.waiting.append(request)

    def schedule(self) -> SchedulerOutput:
        output = SchedulerOutput()
        budget = self._schedule_running(output, self.limits.max_num_batched_tokens)
        if not output.preempted:
            self._schedule_waiting(output, budget)
        return output

    def remove(self, request: SimRequest) -> None:
        """Takes a finished or aborted sequence out of the queues (its blocks are the
        caller's to free or keep)."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status = Status.FINISHED

    def remote_kv_arrived(self, request: SimRequest) -> None:
        """Decode side: the pulled KV is in the request's blocks; cache them and leave the
        last prompt token to compute (its logits give the first output token)."""
        self.kv.cache_blocks(request, request.num_computed_tokens)
        if request.num_computed_tokens >= request.num_tokens:
            request.num_computed_tokens = request.num_tokens - 1
        request.remote_kv_ready = True

    def _chunk_size(self, wanted: int, budget: int) -> int:
        threshold = self.limits.long_prefill_token_threshold
        if 0 < threshold < wanted:
            wanted = threshold
        return min(wanted, budget)

    def _schedule_running(self, output: SchedulerOutput, budget: int) -> int:
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = self._chunk_size(request.num_tokens - request.num_computed_tokens, budget)
            if num_new <= 0:
                index += 1
                continue
            while not self.kv.allocate_slots(request, num_new):
                victim = self.running.pop()
                self._preempt(victim)
                output.preempted.append(victim)
                if victim is request:
                    return budget
            output.chunks.append(ScheduledChunk(request, request.num_computed_tokens, num_new))
            budget -= num_new
            index += 1
        return budget

    def _schedule_waiting(self, output: SchedulerOutput, budget: int) -> None:
        skipped: list[SimRequest] = []
        while self.waiting and budget > 0 and len(self.running) < self.limits.max_num_seqs:
            request = self.waiting[0]
            if request.status is Status.WAITING_FOR_REMOTE_KV and not request.remote_kv_ready:
                skipped.append(self.waiting.popleft())  # its pull is still under way
                continue
            hit, num_external = [], 0
            num_computed = request.num_computed_tokens
            if num_computed == 0:
                hit = self.kv.computed_blocks(request)
                num_local = len(hit) * self.kv.block_size
                if request.wants_remote_prefill and not request.remote_kv_ready:
                    num_external = max(request.num_prompt_tokens - num_local, 0)
                num_computed = num_local + num_external
                self._record_prompt_sources(request, num_local, num_external)
            loads_async = num_external > 0
            num_new = 0 if loads_async else self._chunk_size(request.num_tokens - num_computed, budget)
            if not self.kv.allocate_slots(
                request,
                num_new,
                new_computed_blocks=hit,
                num_external_tokens=num_external,
                delay_caching=loads_async,
            ):
                break
            self.waiting.popleft()
            request.num_computed_tokens = num_computed
            if loads_async:
                request.status = Status.WAITING_FOR_REMOTE_KV
                skipped.append(request)
                output.pulls.append((request, num_external))
                continue
            request.status = Status.RUNNING
            self.running.append(request)
            output.chunks.append(ScheduledChunk(request, num_computed, num_new))
            budget -= num_new
        self.waiting.extendleft(reversed(skipped))

    def _record_prompt_sources(self, request: SimRequest, num_local: int, num_external: int) -> None:
        """Once per sequence, at its first admission (not after a preemption), as vLLM."""
        if request.prompt_stats_recorded:
            return
        request.prompt_stats_recorded = True
        request.num_local_cached_tokens = num_local
        request.num_external_tokens = num_external
        self.prompt_tokens.local_cache_hit += num_local
        self.prompt_tokens.external += num_external
        self.prompt_tokens.computed += request.num_prompt_tokens - num_local - num_external

    def _preempt(self, request: SimRequest) -> None:
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.status = Status.PREEMPTED
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
