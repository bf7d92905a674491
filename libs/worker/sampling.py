"""The contract's SamplingParams -> vLLM's SamplingParams.

Stop *strings* are not given to vLLM: the engine does not detokenize (its tokenizer is loaded
only for the structured-output backends), so the tokenizer service matches them on
detokenized text and the caller aborts the request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cleave.common.v1 import common_pb2
from libs.worker.errors import InvalidRequest

# The fields a model's generation_config.json may default that the contract can leave unset
# (presence/frequency penalties are plain floats, and the gateway always resolves max_tokens).
# The key under which sampling_kwargs passes tokenized bad words to the engine.
BAD_WORDS_TOKEN_IDS = "bad_words_token_ids"
DEFAULTABLE = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def sampling_kwargs(
    params: common_pb2.SamplingParams, *, max_tokens: int, defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Keyword arguments for vllm.SamplingParams; `max_tokens` is already resolved against
    the context length by the caller. `defaults` fill what the request left unset, as vLLM's
    OpenAI server applies `--generation-config auto` defaults."""
    kwargs: dict[str, Any] = {
        "n": params.n or 1,
        "max_tokens": max_tokens,
        "min_tokens": params.min_tokens,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "ignore_eos": params.ignore_eos,
        "skip_special_tokens": params.skip_special_tokens,
        # Detokenization happens in the tokenizer service.
        "detokenize": False,
    }
    if params.HasField("temperature"):
        kwargs["temperature"] = params.temperature
    if params.HasField("top_p"):
        kwargs["top_p"] = params.top_p
    if params.HasField("top_k") and params.top_k > 0:
        kwargs["top_k"] = params.top_k
    if params.HasField("min_p"):
        kwargs["min_p"] = params.min_p
    if params.HasField("seed"):
        kwargs["seed"] = params.seed
    if params.HasField("repetition_penalty"):
        kwargs["repetition_penalty"] = params.repetition_penalty
    if params.stop_token_ids:
        kwargs["stop_token_ids"] = list(params.stop_token_ids)
    if params.HasField("logprobs"):
        kwargs["logprobs"] = params.logprobs
    if params.HasField("prompt_logprobs"):
        kwargs["prompt_logprobs"] = params.prompt_logprobs
    if params.logit_bias:
        kwargs["logit_bias"] = dict(params.logit_bias)
    if params.allowed_token_ids:
        kwargs["allowed_token_ids"] = list(params.allowed_token_ids)
    if params.extra_args_json:
        kwargs["extra_args"] = _extra_args(params.extra_args_json)
    if params.bad_words_token_ids:
        # Not a SamplingParams argument: vLLM derives it from `bad_words` with the engine's
        # tokenizer, which these engines lack; the engine sets it on the params (vllm_engine).
        kwargs[BAD_WORDS_TOKEN_IDS] = [list(word.ids) for word in params.bad_words_token_ids]
    for name in DEFAULTABLE:
        if defaults and name in defaults and not params.HasField(name):
            kwargs[name] = defaults[name]
    structured = _structured_output(params.structured_output)
    if structured:
        kwargs["structured_outputs"] = structured
    _check_ranges(kwargs)
    return kwargs


# extra_args keys the worker itself sets for vLLM's engine (vllm_grammar_prefix,
# vllm_moved_penalties): the engine trusts their shape, so a client's vllm_xargs may not carry
# them (a malformed one would fail inside the engine and take the worker down with it).
RESERVED_EXTRA_ARGS_PREFIX = "cleave_"


def _extra_args(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as error:
        raise InvalidRequest(f"vllm_xargs is not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise InvalidRequest("vllm_xargs must be a JSON object")
    reserved = sorted(key for key in value if key.startswith(RESERVED_EXTRA_ARGS_PREFIX))
    if reserved:
        raise InvalidRequest(
            f"vllm_xargs keys starting with {RESERVED_EXTRA_ARGS_PREFIX!r} are reserved: {reserved}"
        )
    return value


def _structured_output(spec: common_pb2.StructuredOutput) -> dict[str, Any] | None:
    """Keyword arguments for vllm.sampling_params.StructuredOutputsParams (the engine builds
    it, so that vLLM's own checks raise where its errors are mapped). vLLM's input processor
    validates the constraint against its backend (xgrammar here) when the request is added:
    an invalid schema, regex or grammar is refused there as the client's mistake."""
    kind = spec.WhichOneof("kind")
    if kind is None:
        return None
    kwargs: dict[str, Any]
    if kind == "json_schema":
        kwargs = {"json": spec.json_schema}
    elif kind == "choice":
        kwargs = {"choice": list(spec.choice.choices)}
    else:
        kwargs = {kind: getattr(spec, kind)}
    if spec.disable_any_whitespace:
        kwargs["disable_any_whitespace"] = True
    if spec.disable_additional_properties:
        kwargs["disable_additional_properties"] = True
    if spec.HasField("whitespace_pattern"):
        kwargs["whitespace_pattern"] = spec.whitespace_pattern
    return kwargs


# Sequences one request may ask a worker for. vLLM has no bound (each sequence is a request in
# its scheduler); the gateway allows far fewer (--max-sequences-per-request), this stops any
# other gRPC caller from queueing millions on one worker.
MAX_SEQUENCES = 1024


def _check_ranges(kwargs: dict[str, Any]) -> None:
    # vLLM checks these too, but its messages name its own fields; these name the API's.
    checks = [
        ("n", 1 <= kwargs["n"] <= MAX_SEQUENCES, f"n must be in [1, {MAX_SEQUENCES}]"),
        ("temperature", kwargs.get("temperature", 1.0) >= 0, "temperature must be >= 0"),
        ("top_p", 0 < kwargs.get("top_p", 1.0) <= 1, "top_p must be in (0, 1]"),
        ("min_p", 0 <= kwargs.get("min_p", 0.0) <= 1, "min_p must be in [0, 1]"),
        ("presence_penalty", -2 <= kwargs["presence_penalty"] <= 2, "presence_penalty must be in [-2, 2]"),
        ("frequency_penalty", -2 <= kwargs["frequency_penalty"] <= 2, "frequency_penalty must be in [-2, 2]"),
        ("repetition_penalty", kwargs.get("repetition_penalty", 1.0) > 0, "repetition_penalty must be > 0"),
        ("logprobs", kwargs.get("logprobs", 0) >= 0, "logprobs must be >= 0"),
        ("min_tokens", kwargs["min_tokens"] >= 0, "min_tokens must be >= 0"),
    ]
    for _name, ok, message in checks:
        if not ok:
            raise InvalidRequest(message)
