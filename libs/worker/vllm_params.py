"""The worker's settings in vLLM's types: a request's SamplingParams (with the KV handoff), and
the engine's AsyncEngineArgs."""

from __future__ import annotations

from typing import Any

from vllm import SamplingParams
from vllm.config import KVEventsConfig, StructuredOutputsConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.exceptions import VLLMClientError
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

from libs.worker.errors import InvalidRequest
from libs.worker.sampling import BAD_WORDS_TOKEN_IDS


def sampling_params(sampling: dict[str, Any], kv_transfer_params: dict[str, Any] | None) -> SamplingParams:
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
    return params


def remote_cached_tokens(kv_transfer_params: dict[str, Any] | None) -> int | None:
    """On a decode worker, the prefill's cached prompt tokens count as this request's (vLLM's
    output processor reports them so)."""
    if kv_transfer_params and kv_transfer_params.get("do_remote_prefill"):
        cached = kv_transfer_params.get("remote_prefill_cached_tokens")
        if isinstance(cached, int):
            return cached
    return None


def engine_args(engine_kwargs: dict[str, Any]) -> AsyncEngineArgs:
    # AsyncEngineArgs takes config objects (vLLM's CLI parser builds them from the JSON).
    structured = engine_kwargs.get("structured_outputs_config")
    if isinstance(structured, dict):
        engine_kwargs = {**engine_kwargs, "structured_outputs_config": StructuredOutputsConfig(**structured)}
    events = engine_kwargs.get("kv_events_config")
    if isinstance(events, dict):
        engine_kwargs = {**engine_kwargs, "kv_events_config": KVEventsConfig(**events)}
    return AsyncEngineArgs(**engine_kwargs)
