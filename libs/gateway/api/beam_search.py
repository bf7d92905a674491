"""Beam search (`use_beam_search`) for completions and chat, run by the gateway as vLLM's
server runs it.

vLLM does beam search in its API server, not in its engine (vllm/entrypoints/generate/
beam_search/online.py): every step asks the engine for ONE token with 2 x beam_width logprobs
for each live beam, keeps the beam_width best continuations by cumulative logprob, sets aside
beams whose candidate is EOS as finished, and at the end ranks finished and live beams by
cumulative logprob / length ** length_penalty. Cleave's gateway stands where that server
stands, so it runs the same loop over its own pipeline: each step's requests are ordinary
one-token generations routed like any other (in P/D each is a prefill on a prefill worker;
the engines' prefix caches make it a one-token prefill after the first step). The gap this
fills: vLLM's loop lives in its serving classes, which Cleave does not run.

`runner` returns a function with the pipeline's own signature (spec -> events), so the
response assembly is the one every request uses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

from cleave.common.v1 import common_pb2
from libs.gateway.api.cancellation import gather_or_cancel
from libs.gateway.api.responses import Generate, Generation, collect
from libs.gateway.common import errors
from libs.gateway.common.generation import Finished, GenerationSpec, SequenceEvent


@dataclass(frozen=True)
class BeamSearchParams:
    """vLLM's BeamSearchParams, as its requests' to_beam_search_params fill them."""

    beam_width: int  # the request's n
    max_tokens: int
    temperature: float = 1.0  # vLLM: the request's, else the model's default, else 1.0
    ignore_eos: bool = False
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False  # keep the EOS token in a finished beam


@dataclass(frozen=True)
class Beam:
    tokens: tuple[int, ...]  # generated so far (a finished beam's EOS only if kept)
    cum_logprob: float = 0.0
    logprobs: tuple[common_pb2.TokenLogprob, ...] = ()
    finish_reason: str | None = None
    stop_reason: int | None = None


def score(beam: Beam, prompt_len: int, eos_token_id: int, length_penalty: float) -> float:
    """vLLM's get_beam_search_score: the length counts the prompt and not a final EOS."""
    length = prompt_len + len(beam.tokens)
    if beam.tokens and beam.tokens[-1] == eos_token_id:
        length -= 1
    return beam.cum_logprob / (max(length, 1) ** length_penalty)


def _candidates(entry: common_pb2.TokenLogprob) -> dict[int, float]:
    # vLLM's step logprobs: the top 2 x beam_width and the sampled token (if not among them).
    found = {top.token_id: top.logprob for top in entry.top}
    found.setdefault(entry.token_id, entry.logprob)
    return found


def advance(
    beams: Sequence[Beam],
    steps: Sequence[common_pb2.TokenLogprob],
    params: BeamSearchParams,
    eos_token_id: int,
) -> tuple[list[Beam], list[Beam]]:
    """One step: the live beams' next-token logprobs -> (the beam_width best live beams,
    the beams that ended on EOS in this step)."""
    finished: list[Beam] = []
    ranked: list[tuple[float, int, Beam, common_pb2.TokenLogprob]] = []
    for beam, entry in zip(beams, steps, strict=True):
        for token_id, logprob in _candidates(entry).items():
            total = beam.cum_logprob + logprob
            if token_id == eos_token_id and not params.ignore_eos:
                kept = (eos_token_id,) if params.include_stop_str_in_output else ()
                finished.append(
                    Beam(beam.tokens + kept, total, (*beam.logprobs, entry), "stop", eos_token_id)
                )
            else:
                ranked.append((total, token_id, beam, entry))
    ranked.sort(key=lambda candidate: candidate[0], reverse=True)  # stable: ties keep their order
    live = [
        Beam((*beam.tokens, token_id), total, (*beam.logprobs, entry))
        for total, token_id, beam, entry in ranked[: params.beam_width]
    ]
    return live, finished


def best(
    live: Sequence[Beam],
    finished: Sequence[Beam],
    params: BeamSearchParams,
    prompt_len: int,
    eos_token_id: int,
) -> list[Beam]:
    """The beam_width best of the finished and the still-live beams (these end on `length`)."""
    pool = [*finished, *(dataclasses.replace(beam, finish_reason="length") for beam in live)]
    pool.sort(key=lambda beam: score(beam, prompt_len, eos_token_id, params.length_penalty), reverse=True)
    return pool[: params.beam_width]


def _step_logprobs(generation: Generation) -> common_pb2.TokenLogprob:
    logprobs = generation.choices[0].logprobs
    if not logprobs:  # a worker that answered a logprobs request without them
        raise errors.ApiError(502, "a beam search step came back without logprobs", type_="server_error")
    return logprobs[0]


def params_for(spec: GenerationSpec, length_penalty: float) -> BeamSearchParams:
    """From a request's spec (n, max_tokens, temperature already resolved), as vLLM's
    to_beam_search_params; an unset temperature is 1.0, as there."""
    sampling = spec.sampling
    return BeamSearchParams(
        beam_width=sampling.n or 1,
        max_tokens=sampling.max_tokens,
        temperature=sampling.temperature if sampling.HasField("temperature") else 1.0,
        ignore_eos=sampling.ignore_eos,
        length_penalty=length_penalty,
        include_stop_str_in_output=spec.include_stop_str_in_output,
    )


def _step_spec(
    spec: GenerationSpec, beam: Beam, step: int, index: int, params: BeamSearchParams
) -> GenerationSpec:
    # vLLM's step request: one token, 2 x beam_width logprobs, the temperature, nothing else.
    sampling = common_pb2.SamplingParams(
        max_tokens=1, logprobs=2 * params.beam_width, temperature=params.temperature, n=1
    )
    return dataclasses.replace(
        spec,
        request_id=f"{spec.request_id}-beam-{step}-{index}",
        prompt_token_ids=[*spec.prompt_token_ids, *beam.tokens],
        sampling=sampling,
        stops=[],
    )


def runner(
    generate: Generate,
    length_penalty: float,
    eos_token_id: int,
    text: Callable[[Sequence[int]], Awaitable[str]],
) -> Generate:
    """A generate function (spec -> events) that runs beam search on `generate`'s one-token
    steps and yields the best beams as the sequences 0..beam_width-1, then Finished."""

    async def run(spec: GenerationSpec) -> AsyncIterator[SequenceEvent | Finished]:
        params = params_for(spec, length_penalty)
        live: list[Beam] = [Beam(())]
        finished: list[Beam] = []
        prompt_len = len(spec.prompt_token_ids)
        for step in range(params.max_tokens):
            steps = await gather_or_cancel(
                *(collect(generate, _step_spec(spec, beam, step, i, params)) for i, beam in enumerate(live))
            )
            entries = [_step_logprobs(generation) for generation in steps]
            live, ended = advance(live, entries, params, eos_token_id)
            finished += ended
            if not live:
                break
        chosen = best(live, finished, params, prompt_len, eos_token_id)
        for index, beam in enumerate(chosen):
            shown = beam.tokens[:-1] if beam.tokens and beam.tokens[-1] == eos_token_id else beam.tokens
            yield SequenceEvent(
                index=index,
                text=await text(shown),
                token_ids=list(beam.tokens),
                logprobs=list(beam.logprobs),
                finish_reason=beam.finish_reason,
                stop_reason=beam.stop_reason,
            )
        yield Finished(
            prompt_tokens=prompt_len,
            completion_tokens=sum(len(beam.tokens) for beam in chosen),
            cached_prompt_tokens=0,
        )

    return run
