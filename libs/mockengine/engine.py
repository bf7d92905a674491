"""MockEngine: the worker's Engine protocol (libs/worker/engine.py) on a mock engine core.

Like vLLM's AsyncLLM, one output-handler task reads each step's outputs from the core and
hands every request its part (one EngineStep per request per step); generate() reads its
own queue. What the mock cannot simulate is refused as the client's mistake
(InvalidRequest): structured output, images and image embeddings; a speculative-decoding
config is refused when the engine starts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from libs.kvevents.cached_blocks import updates_from_events
from libs.kvevents.hashing import BlockHasher
from libs.kvlayout.layout import KvFacts
from libs.mockengine.client import CoreDied, EngineCoreClient
from libs.mockengine.config import CoreConfig, resolve
from libs.mockengine.options import MockEngineOptions
from libs.mockengine.protocol import AddRequest, CoreStats, EngineCoreOutputs, LoraSpec
from libs.mockengine.requests import sampling_spec, step_from_outputs
from libs.worker.engine import Adapter, EngineInfo, EngineStats, EngineStep, SchedulerLimits
from libs.worker.errors import EngineUnavailable, InvalidRequest, KvTransferFailed
from libs.worker.kv_cache_feed import KvCacheFeed

ENGINE_VERSION = "cleave-mock 1"


@dataclass
class _Stream:
    n: int
    handed_over: bool  # decode side: the prompt's KV comes from a prefill engine
    queue: asyncio.Queue[list[Any] | BaseException] = field(default_factory=asyncio.Queue)
    finished: set[int] = field(default_factory=set)
    first: bool = True


class MockEngine:
    def __init__(
        self,
        client: EngineCoreClient,
        config: CoreConfig,
        info: EngineInfo,
        on_outputs: Callable[[EngineCoreOutputs], None] | None = None,
    ) -> None:
        self._client = client
        self._on_outputs = on_outputs
        # The core's KV events, hashed as vLLM hashes (simulator.py), for WatchKvCache.
        self.kv_cache_feed: KvCacheFeed | None = KvCacheFeed(
            BlockHasher(info.kv.block_size, config.prefix_caching_hash_algo)
        )
        self._config = config
        self._info = info
        self._lora_ids: dict[Adapter, int] = {}
        self._streams: dict[str, _Stream] = {}
        self._handler = asyncio.create_task(self._handle_outputs())

    @classmethod
    async def start(
        cls, options: MockEngineOptions, *, on_outputs: Callable[[EngineCoreOutputs], None] | None = None
    ) -> MockEngine:
        """Starts the core process and waits for it (the profile's start-up time, scaled).
        `on_outputs` sees every message of the core (each step's outputs, KV events and
        stats) before the requests do: where a worker would publish KV events."""
        if options.speculative_config:
            raise InvalidRequest(
                "the mock engine does not simulate speculative decoding; drop the speculative config"
            )
        config = options.core_config()
        resolved = resolve(config)  # refuses a bad profile here, not in the child
        client = await EngineCoreClient.start(config)
        model = resolved.profile.model
        info = EngineInfo(
            model=options.served_model_name or model.name,
            vocab_size=model.vocab_size,
            max_model_len=resolved.max_model_len,
            kv=KvFacts(
                model_fingerprint=f"mock:{resolved.profile.name}:{model.name}",
                block_size=resolved.block_size,
                kv_cache_dtype=model.kv_cache_dtype,
                num_layers=model.num_layers,
                num_kv_heads=model.num_kv_heads,
                head_dim=model.head_dim,
            ),
            num_kv_blocks=client.ready.num_kv_blocks,
            engine_id=config.engine_id,
            engine_version=f"{ENGINE_VERSION} (profile {resolved.profile.name}, time scale {config.time_scale})",
            scheduler=SchedulerLimits.of(resolved),
        )
        return cls(client, config, info, on_outputs)

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def side_channel_port(self) -> int:
        """The port the core serves pulls on (0: none); what kv_port=0 resolved to."""
        return self._client.ready.side_channel_port

    @property
    def core_pid(self) -> int:
        return self._client.pid

    def _lora_spec(self, lora: Adapter | None) -> LoraSpec | None:
        """The adapter with this engine's id for it, given on first use, as vLLM's worker does
        (the simulator hashes blocks by name and path, and publishes the id in its events)."""
        if lora is None:
            return None
        int_id = self._lora_ids.setdefault(lora, len(self._lora_ids) + 1)
        return LoraSpec(lora.name, lora.path, int_id)

    async def load_lora(self, adapter: Adapter) -> None:
        """The simulator keeps no adapter weights: an adapter is its name and path."""
        self._lora_spec(adapter)

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: dict[str, Any],
        kv_transfer_params: dict[str, Any] | None = None,
        *,
        cache_salt: str = "",
        image_embeddings: Sequence[Any] = (),
        images: Sequence[Any] = (),
        sequences: Sequence[tuple[int, Sequence[int]]] = (),
        lora: Adapter | None = None,
    ) -> AsyncIterator[EngineStep]:
        if image_embeddings or images:
            raise InvalidRequest("the mock engine does not simulate images; send text-only prompts")
        if sequences:
            raise InvalidRequest(
                "the mock engine does not continue moved requests' sequences (n > 1, structured output)"
            )
        if self.dead:
            raise EngineUnavailable("the mock engine's core died; this worker cannot serve until restarted")
        spec = sampling_spec(sampling)
        self._check(request_id, prompt_token_ids, spec.n, kv_transfer_params)
        stream = _Stream(spec.n, bool(kv_transfer_params and kv_transfer_params.get("do_remote_prefill")))
        self._streams[request_id] = stream
        done = False
        try:
            await self._client.add_request(
                AddRequest(
                    request_id=request_id,
                    prompt_token_ids=list(prompt_token_ids),
                    sampling=spec,
                    cache_salt=cache_salt,
                    lora=self._lora_spec(lora),
                    kv_transfer_params=kv_transfer_params,
                )
            )
            while not done:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                step = step_from_outputs(item, stream.first)
                stream.first = False
                stream.finished.update(s.index for s in step.sequences if s.finish_reason is not None)
                done = len(stream.finished) >= stream.n
                errors = [
                    o.error or "the engine failed the request" for o in item if o.finish_reason == "error"
                ]
                if errors:
                    done = True
                    if stream.handed_over:
                        raise KvTransferFailed(f"{errors[0]}; prefill again")
                    raise RuntimeError(errors[0])
                yield EngineStep(
                    sequences=step.sequences,
                    finished=done,
                    num_prompt_tokens=step.num_prompt_tokens,
                    num_cached_tokens=step.num_cached_tokens,
                    kv_transfer_params=step.kv_transfer_params,
                    prompt_logprobs=step.prompt_logprobs,
                )
        finally:
            self._streams.pop(request_id, None)
            if not done and not self.dead:
                # The caller stopped reading (cancelled): as vLLM's generate, abort it.
                with contextlib.suppress(CoreDied):
                    await self._client.abort([request_id])

    def _check(
        self, request_id: str, prompt: Sequence[int], n: int, kv_transfer_params: dict[str, Any] | None
    ) -> None:
        if request_id in self._streams:
            raise InvalidRequest(f"request id {request_id!r} is already running on this engine")
        if not prompt:
            raise InvalidRequest("the prompt is empty")
        if len(prompt) > self._info.max_model_len:
            raise InvalidRequest(
                f"the prompt ({len(prompt)} tokens) is longer than the maximum model length {self._info.max_model_len}"
            )
        vocab = self._info.vocab_size
        if any(not 0 <= token < vocab for token in prompt):
            raise InvalidRequest(f"a prompt token id is out of the vocabulary (0..{vocab - 1})")
        if kv_transfer_params and n != 1:
            raise InvalidRequest("the mock engine hands KV over for single-sequence (n = 1) requests only")

    async def _handle_outputs(self) -> None:
        """vLLM's output handler: one message per step, split per request."""
        try:
            while True:
                outputs: EngineCoreOutputs = await self._client.get_output()
                if outputs.kv_events and self.kv_cache_feed is not None:
                    self.kv_cache_feed.publish(updates_from_events(outputs.kv_events))
                if self._on_outputs is not None:
                    self._on_outputs(outputs)
                by_request: dict[str, list[Any]] = {}
                for output in outputs.outputs:
                    by_request.setdefault(output.request_id, []).append(output)
                for request_id, entries in by_request.items():
                    stream = self._streams.get(request_id)
                    if stream is not None:
                        stream.queue.put_nowait(entries)
        except CoreDied:
            died = EngineUnavailable("the mock engine's core died; this worker cannot serve until restarted")
            for stream in self._streams.values():
                stream.queue.put_nowait(died)

    async def abort(self, request_id: str) -> None:
        with contextlib.suppress(CoreDied):
            await self._client.abort([request_id])

    async def release_handoff(self, request_id: str, kv_transfer_params: dict[str, Any]) -> None:
        with contextlib.suppress(CoreDied):
            await self._client.release_handoff(request_id, kv_transfer_params)

    def stats(self) -> EngineStats:
        return engine_stats(self._client.latest_stats, self._client.stats_received)

    async def fresh_stats(self) -> EngineStats:
        """Stats asked of the core now (stats() gives those of its last message)."""
        stats = await self._client.get_stats()
        return engine_stats(stats, self._client.stats_received)

    async def reset_prefix_cache(self) -> bool:
        return await self._client.reset_prefix_cache()

    @property
    def dead(self) -> bool:
        return self._client.dead

    async def shutdown(self) -> None:
        self._handler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._handler
        await self._client.shutdown()


def engine_stats(core: CoreStats, updates: int = 0) -> EngineStats:
    stats = EngineStats(
        num_running=core.num_running,
        num_waiting=core.num_waiting,
        kv_cache_usage=core.kv_cache_usage,
        prompt_tokens_computed=core.prompt_tokens_computed,
        prompt_tokens_local_cache_hit=core.prompt_tokens_local_cache_hit,
        prompt_tokens_external=core.prompt_tokens_external,
        requests_finished=core.requests_finished,
        updates=updates,
    )
    if core.kv_pull_transfers or core.kv_pull_failures:
        stats.kv_pulls = {
            "transfers": core.kv_pull_transfers,
            "seconds": core.kv_pull_seconds,
            "bytes": core.kv_pull_bytes,
            "failures": core.kv_pull_failures,
        }
    return stats
