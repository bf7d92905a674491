"""Conversions at the adapter's edges: the worker's sampling dict -> the core's SamplingSpec,
and one request's outputs of a step -> an EngineStep."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from libs.mockengine.protocol import EngineCoreOutput, Logprobs, SamplingSpec
from libs.worker.engine import EngineStep, SequenceDelta, TokenLogprob, TopLogprob
from libs.worker.errors import InvalidRequest

# Sampling keys that ask for what the mock cannot simulate.
STRUCTURED_OUTPUT_KEYS = (
    "structured_outputs",
    "guided_decoding",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)


def sampling_spec(sampling: dict[str, Any]) -> SamplingSpec:
    """The keys that change what the mock does; the others (penalties, top_p, ...) change
    nothing in a model that has no logits, and are accepted."""
    for key in STRUCTURED_OUTPUT_KEYS:
        if sampling.get(key):
            raise InvalidRequest("the mock engine does not simulate structured output")
    try:
        spec = SamplingSpec(
            n=int(sampling.get("n", 1)),
            max_tokens=int(sampling.get("max_tokens", 16)),
            min_tokens=int(sampling.get("min_tokens", 0)),
            temperature=float(sampling.get("temperature", 1.0)),
            seed=None if sampling.get("seed") is None else int(sampling["seed"]),
            ignore_eos=bool(sampling.get("ignore_eos", False)),
            stop_token_ids=[int(t) for t in sampling.get("stop_token_ids") or ()],
            logprobs=None if sampling.get("logprobs") is None else int(sampling["logprobs"]),
            prompt_logprobs=None
            if sampling.get("prompt_logprobs") is None
            else int(sampling["prompt_logprobs"]),
        )
    except (TypeError, ValueError) as error:
        raise InvalidRequest(f"bad sampling parameters: {error}") from None
    if spec.n < 1 or spec.max_tokens < 1 or spec.min_tokens < 0 or spec.temperature < 0:
        raise InvalidRequest("n and max_tokens must be >= 1, min_tokens and temperature >= 0")
    if spec.min_tokens > spec.max_tokens:
        raise InvalidRequest(f"min_tokens ({spec.min_tokens}) must be <= max_tokens ({spec.max_tokens})")
    return spec


def step_from_outputs(outputs: Sequence[EngineCoreOutput], first: bool) -> EngineStep:
    """One request's outputs of one core message (one entry per sequence that has news)."""
    by_index: dict[int, EngineCoreOutput] = {}
    for output in outputs:
        earlier = by_index.get(output.index)
        by_index[output.index] = output if earlier is None else _merge(earlier, output)
    sequences = tuple(
        SequenceDelta(
            index=o.index,
            token_ids=tuple(o.new_token_ids),
            logprobs=tuple(_logprob(lp) for lp in o.new_logprobs or ()),
            finish_reason=o.finish_reason,
            stop_token_id=o.stop_reason,
        )
        for o in sorted(by_index.values(), key=lambda o: o.index)
    )
    lead = outputs[0]
    prompt_logprobs = None
    if first:
        with_prompt = next((o for o in outputs if o.new_prompt_logprobs is not None), None)
        if with_prompt is not None and with_prompt.new_prompt_logprobs is not None:
            prompt_logprobs = tuple(
                None if lp is None else _logprob(lp) for lp in with_prompt.new_prompt_logprobs
            )
    return EngineStep(
        sequences=sequences,
        finished=False,  # the adapter knows when every sequence has finished
        num_prompt_tokens=lead.num_prompt_tokens,
        num_cached_tokens=max(o.num_cached_tokens for o in outputs),
        kv_transfer_params=next((o.kv_transfer_params for o in outputs if o.kv_transfer_params), None),
        prompt_logprobs=prompt_logprobs,
    )


def _merge(earlier: EngineCoreOutput, later: EngineCoreOutput) -> EngineCoreOutput:
    return EngineCoreOutput(
        request_id=later.request_id,
        index=later.index,
        new_token_ids=earlier.new_token_ids + later.new_token_ids,
        new_logprobs=(earlier.new_logprobs or []) + (later.new_logprobs or []) or None,
        new_prompt_logprobs=earlier.new_prompt_logprobs or later.new_prompt_logprobs,
        finish_reason=later.finish_reason or earlier.finish_reason,
        stop_reason=later.stop_reason if later.stop_reason is not None else earlier.stop_reason,
        num_prompt_tokens=later.num_prompt_tokens or earlier.num_prompt_tokens,
        num_cached_tokens=max(earlier.num_cached_tokens, later.num_cached_tokens),
        kv_transfer_params=later.kv_transfer_params or earlier.kv_transfer_params,
        error=later.error or earlier.error,
    )


def _logprob(entry: Logprobs) -> TokenLogprob:
    """Entry 0 is the token itself; `top` holds every entry by rank, as vllm_engine.py builds it."""
    top = sorted(
        (
            TopLogprob(token_id=t, logprob=lp, rank=r)
            for t, lp, r in zip(entry.token_ids, entry.logprobs, entry.ranks, strict=True)
        ),
        key=lambda item: item.rank,
    )
    return TokenLogprob(
        token_id=entry.token_ids[0], logprob=entry.logprobs[0], rank=entry.ranks[0], top=tuple(top)
    )
