"""One engine's simulated state and its step, without any I/O or sleeping (vLLM's
EngineCore.step: schedule, "run the model", update from its output).

The core process (core.py) owns the clock, the sockets and the KV pulls; everything here
runs in microseconds and is what the unit tests drive directly.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from libs.kvevents.hashing import BlockHasher, LoraIdentity
from libs.mockengine.blocks import BlockPool
from libs.mockengine.config import ResolvedConfig
from libs.mockengine.kv_events import KvEvent
from libs.mockengine.kv_manager import KvCacheManager
from libs.mockengine.leases import LeaseTable
from libs.mockengine.protocol import AddRequest, CoreStats, EngineCoreOutput
from libs.mockengine.request import SimRequest, check_stop
from libs.mockengine.scheduler import Scheduler, SchedulerLimits
from libs.mockengine.timing import BatchShape
from libs.mockengine.tokens import TokenModel, context_hash, extend_context, sampling_key


@dataclass(frozen=True)
class PullOrder:
    """Decode side: KV to fetch from a prefill engine before `request` can run."""

    request: SimRequest
    params: dict[str, Any]
    num_blocks: int
    num_bytes: int


@dataclass
class SimStep:
    outputs: list[EngineCoreOutput]
    shape: BatchShape
    pulls: list[PullOrder]
    kv_events: list[KvEvent] = field(default_factory=list)


@dataclass
class PullCounters:
    transfers: int = 0
    seconds: float = 0.0
    num_bytes: int = 0
    failures: int = 0


class Simulator:
    def __init__(self, resolved: ResolvedConfig, *, side_channel: tuple[str, int] | None = None) -> None:
        config = resolved.config
        model = resolved.profile.model
        self.resolved = resolved
        self.engine_id = config.engine_id
        self.side_channel = side_channel
        self.max_model_len = resolved.max_model_len
        self.eos_token_id = model.eos_token_id
        self.pool = BlockPool(resolved.num_kv_blocks, enable_caching=config.enable_prefix_caching)
        self.kv = KvCacheManager(
            self.pool,
            BlockHasher(resolved.block_size, config.prefix_caching_hash_algo),
            max_model_len=resolved.max_model_len,
        )
        limits = SchedulerLimits(
            resolved.max_num_seqs, resolved.max_num_batched_tokens, config.long_prefill_token_threshold
        )
        self.scheduler = Scheduler(limits, self.kv)
        self.tokens = TokenModel(model.vocab_size, model.eos_token_id, config.eos_probability)
        self.leases = LeaseTable(self.pool, config.kv_lease_s)
        self.pulls = PullCounters()
        self._sequences: dict[str, list[SimRequest]] = {}
        self._arrivals = 0
        self.requests_finished = 0

    # -- requests --------------------------------------------------------------------------
    def add(self, add: AddRequest) -> None:
        if add.request_id in self._sequences:
            raise ValueError(f"request id {add.request_id!r} is already running on this engine")
        sampling = add.sampling
        seed = sampling.seed if sampling.seed is not None else random.getrandbits(64)
        lora = LoraIdentity(add.lora.name, add.lora.path, add.lora.int_id) if add.lora else None
        prompt_hash = context_hash(add.prompt_token_ids)
        sequences = []
        for index in range(sampling.n):
            self._arrivals += 1
            sequences.append(
                SimRequest(
                    request_id=add.request_id,
                    index=index,
                    prompt_token_ids=list(add.prompt_token_ids),
                    sampling=sampling,
                    sampling_key=sampling_key(temperature=sampling.temperature, seed=seed, index=index),
                    context_hash=prompt_hash,
                    cache_salt=add.cache_salt,
                    lora=lora,
                    kv_transfer_params=add.kv_transfer_params,
                    arrival=self._arrivals,
                )
            )
        self._sequences[add.request_id] = sequences
        for sequence in sequences:
            self.scheduler.add(sequence)

    def abort(self, request_ids: Iterable[str]) -> list[EngineCoreOutput]:
        """Ends the requests' unfinished sequences at once, freeing their blocks; unknown or
        finished ids are ignored (vLLM's abort)."""
        outputs = []
        for request_id in request_ids:
            for sequence in self._sequences.get(request_id, ()):
                if not sequence.is_finished:
                    sequence.finish_reason = "abort"
                    outputs.append(self._finish(sequence))
        return outputs

    def fail(self, request: SimRequest, error: str) -> EngineCoreOutput | None:
        """Ends a sequence with finish reason "error" (a KV pull that failed), unless it
        already ended (aborted while its pull ran)."""
        if request.is_finished:
            return None
        request.finish_reason = "error"
        request.error = error
        return self._finish(request)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    # -- the step ----------------------------------------------------------------------------
    def step(self) -> SimStep:
        schedule = self.scheduler.schedule()
        outputs = []
        for chunk in schedule.chunks:
            sequence = chunk.request
            sequence.num_computed_tokens += chunk.num_tokens
            if sequence.num_computed_tokens >= sequence.num_tokens:  # else: a prompt chunk
                outputs.append(self._sample(sequence))
        shape = BatchShape.of((c.start, c.num_tokens, c.is_decode) for c in schedule.chunks)
        pulls = [self._pull_order(sequence, num_tokens) for sequence, num_tokens in schedule.pulls]
        return SimStep(outputs, shape, pulls, self.pool.take_events())

    def take_kv_events(self) -> list[KvEvent]:
        return self.pool.take_events()

    def _sample(self, sequence: SimRequest) -> EngineCoreOutput:
        before = sequence.context_hash
        token = self.tokens.next_token(
            before, sequence.sampling_key, banned=sequence.banned_tokens(self.eos_token_id)
        )
        sequence.output_token_ids.append(token)
        sequence.all_token_ids.append(token)
        sequence.context_hash = extend_context(before, (token,))
        self.kv.update_hashes(sequence)
        output = EngineCoreOutput(
            request_id=sequence.request_id,
            index=sequence.index,
            new_token_ids=[token],
            num_prompt_tokens=sequence.num_prompt_tokens,
            num_cached_tokens=sequence.num_local_cached_tokens + sequence.num_external_tokens,
        )
        sampling = sequence.sampling
        if sampling.logprobs is not None:
            top = max(sampling.logprobs, 1)
            output.new_logprobs = [self.tokens.logprobs(before, sequence.sampling_key, token, top)]
        if sampling.prompt_logprobs is not None and not sequence.prompt_logprobs_sent:
            sequence.prompt_logprobs_sent = True
            output.new_prompt_logprobs = self.tokens.prompt_logprobs(
                sequence.prompt_token_ids, sampling.prompt_logprobs
            )
        if check_stop(sequence, eos_token_id=self.eos_token_id, max_model_len=self.max_model_len):
            finished = self._finish(sequence)
            output.finish_reason = finished.finish_reason
            output.stop_reason = finished.stop_reason
            output.kv_transfer_params = finished.kv_transfer_params
        return output

    def _finish(self, sequence: SimRequest) -> EngineCoreOutput:
        self.scheduler.remove(sequence)
        params = None
        if (
            sequence.wants_remote_decode
            and sequence.finish_reason in ("length", "stop")
            and self.side_channel is not None
            and sequence.sampling.n == 1
            and sequence.blocks
        ):
            params = self._hand_off(sequence)
        else:
            self.kv.free(sequence)
        siblings = self._sequences.get(sequence.request_id, [])
        if all(s.is_finished for s in siblings):
            self._sequences.pop(sequence.request_id, None)
            self.requests_finished += 1
        return EngineCoreOutput(
            request_id=sequence.request_id,
            index=sequence.index,
            finish_reason=sequence.finish_reason,
            stop_reason=sequence.stop_reason,
            num_prompt_tokens=sequence.num_prompt_tokens,
            num_cached_tokens=sequence.num_local_cached_tokens + sequence.num_external_tokens,
            kv_transfer_params=params,
            error=sequence.error,
        )

    def _hand_off(self, sequence: SimRequest) -> dict[str, Any]:
        """Keeps the finished prefill's blocks under a lease and describes them as vLLM's
        NIXL connector does (request_finished's kv_transfer_params)."""
        assert self.side_channel is not None
        blocks = sequence.blocks
        sequence.blocks = []
        self.leases.hold(sequence.request_id, blocks, sequence.num_computed_tokens)
        host, port = self.side_channel
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [[block.block_id for block in blocks]],
            "remote_engine_id": self.engine_id,
            "remote_request_id": sequence.request_id,
            "remote_host": host,
            "remote_port": port,
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": sequence.num_computed_tokens,
            "remote_prefill_cached_tokens": sequence.num_local_cached_tokens,
            "transfer_mode": "pull",
        }

    def _pull_order(self, sequence: SimRequest, num_tokens: int) -> PullOrder:
        num_blocks = self.kv.blocks_for(sequence.num_computed_tokens) - self.kv.blocks_for(
            sequence.num_computed_tokens - num_tokens
        )
        return PullOrder(
            sequence,
            dict(sequence.kv_transfer_params or {}),
            num_blocks,
            num_blocks * self.resolved.kv_bytes_per_block,
        )

    def pull_succeeded(self, order: PullOrder, seconds: float) -> None:
        self.pulls.transfers += 1
        self.pulls.seconds += seconds
        self.pulls.num_bytes += order.num_bytes
        if not order.request.is_finished:
            self.scheduler.remote_kv_arrived(order.request)

    def pull_failed(self, order: PullOrder, error: str) -> EngineCoreOutput | None:
        self.pulls.failures += 1
        return self.fail(order.request, f"KV transfer failed: {error}")

    # -- stats -------------------------------------------------------------------------------
    def stats(self, *, steps: int, busy_s: float) -> CoreStats:
        prompt = self.scheduler.prompt_tokens
        return CoreStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_cache_usage=self.pool.usage,
            prompt_tokens_computed=prompt.computed,
            prompt_tokens_local_cache_hit=prompt.local_cache_hit,
            prompt_tokens_external=prompt.external,
            requests_finished=self.requests_finished,
            num_preemptions=self.scheduler.num_preemptions,
            num_leases=len(self.leases),
            kv_pull_transfers=self.pulls.transfers,
            kv_pull_seconds=self.pulls.seconds,
            kv_pull_bytes=self.pulls.num_bytes,
            kv_pull_failures=self.pulls.failures,
            steps=steps,
            simulated_busy_s=busy_s,
        )
