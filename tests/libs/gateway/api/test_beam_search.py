"""Beam search over one-token steps (libs/gateway/api/beam_search.py), on a table "model" where
the most likely first token leads to a worse sequence: greedy picks "," then EOS, beam search
finds " world" "é" (0.4 x 0.9 x 0.99 against 0.5 x 0.4)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from cleave.common.v1 import common_pb2
from libs.gateway.api import beam_search
from libs.gateway.api.responses import Choice, collect
from libs.gateway.common.generation import GenerationSpec
from tests.libs.gateway.fakes import VOCAB, TableModel, spec

pytestmark = pytest.mark.anyio
EOS = 4
TABLE = {
    1: {2: 0.5, 3: 0.4, EOS: 0.1},  # after the prompt's last token
    2: {5: 0.3, 6: 0.3, EOS: 0.4},
    3: {5: 0.9, EOS: 0.1},
    5: {EOS: 0.99, 6: 0.01},
    6: {EOS: 0.5, 5: 0.5},
    EOS: {5: 0.6, 6: 0.4},  # only reached with ignore_eos
}


async def text(ids: Sequence[int]) -> str:
    return "".join(VOCAB[i] for i in ids)


def beam_spec(width: int, max_tokens: int = 3, **fields: Any) -> GenerationSpec:
    sampling = common_pb2.SamplingParams(n=width, max_tokens=max_tokens, temperature=0.0)
    return dataclasses.replace(spec(n=width, prompt=(1,)), sampling=sampling, **fields)


async def run(width: int, length_penalty: float = 1.0, **fields: Any) -> tuple[TableModel, dict[int, Choice]]:
    model = TableModel(TABLE)
    generate = beam_search.runner(model.generate, length_penalty, EOS, text)
    generation = await collect(generate, beam_spec(width, **fields))
    return model, generation.choices


async def test_beam_search_finds_the_likelier_sequence_greedy_misses() -> None:
    model, choices = await run(width=2)
    best, second = choices[0], choices[1]
    assert (best.token_ids, best.text, best.finish_reason, best.stop_reason) == (
        [3, 5],
        " worldé",
        "stop",
        EOS,
    )
    assert second.token_ids == [2, 5]
    # Every step is one token with 2 x beam_width logprobs, the live beam's tokens appended.
    assert {(s.sampling.max_tokens, s.sampling.logprobs, s.sampling.n) for s in model.specs} == {(1, 4, 1)}
    assert [s.prompt_token_ids for s in model.specs[:3]] == [[1], [1, 2], [1, 3]]
    assert [s.request_id for s in model.specs[:3]] == ["r1-beam-0-0", "r1-beam-1-0", "r1-beam-1-1"]
    assert len(model.specs) == 1 + 2 + 2  # max_tokens steps, at most beam_width beams each


async def test_width_one_still_ranks_finished_beams_by_length_normalised_score() -> None:
    # Width 1 sees 2 logprobs a step, so EOS (0.1) is no candidate after the prompt; "," is kept.
    # Then "," + EOS ends (ln .2 / 2 = -0.80) while ",é" lives on and ends next step
    # (ln .1485 / 3 = -0.64): the longer finished beam wins on score per token.
    _model, choices = await run(width=1)
    assert (choices[0].token_ids, choices[0].finish_reason) == ([2, 5], "stop")


async def test_length_penalty_zero_ranks_by_total_logprob() -> None:
    # Score = cum logprob: [3, 5] (ln .3564) first, then [2] (ln .2) ahead of [2, 5] (ln .1485).
    _model, choices = await run(width=2, length_penalty=0.0)
    assert [choices[0].token_ids, choices[1].token_ids] == [[3, 5], [2]]


async def test_include_stop_str_keeps_the_eos_token_but_not_its_text() -> None:
    _model, choices = await run(width=2, include_stop_str_in_output=True)
    assert (choices[0].token_ids, choices[0].text) == ([3, 5, EOS], " worldé")


async def test_ignore_eos_runs_every_beam_to_max_tokens() -> None:
    model = TableModel(TABLE)
    generate = beam_search.runner(model.generate, 1.0, EOS, text)
    sampling = common_pb2.SamplingParams(n=2, max_tokens=3, temperature=0.0, ignore_eos=True)
    generation = await collect(generate, dataclasses.replace(spec(n=2, prompt=(1,)), sampling=sampling))
    assert all(len(c.token_ids) == 3 and c.finish_reason == "length" for c in generation.choices.values())


def test_advance_sets_aside_eos_and_keeps_the_width_best() -> None:
    params = beam_search.BeamSearchParams(beam_width=2, max_tokens=5)
    entry = common_pb2.TokenLogprob(
        token_id=7, logprob=-0.1, top=[common_pb2.TopLogprob(token_id=EOS, logprob=-1.0),
                                       common_pb2.TopLogprob(token_id=8, logprob=-2.0),
                                       common_pb2.TopLogprob(token_id=9, logprob=-3.0)],
    )  # fmt: skip
    live, ended = beam_search.advance([beam_search.Beam((1,), -0.5)], [entry], params, EOS)
    # The sampled token (7) counts as a candidate although it is not in the top list.
    assert [(b.tokens, round(b.cum_logprob, 3)) for b in live] == [((1, 7), -0.6), ((1, 8), -2.5)]
    assert [(b.tokens, b.finish_reason, b.stop_reason) for b in ended] == [((1,), "stop", EOS)]


def test_the_score_divides_by_the_length_with_the_prompt_and_without_a_final_eos() -> None:
    beam = beam_search.Beam((3, 5, EOS), cum_logprob=-6.0)
    assert beam_search.score(beam, prompt_len=1, eos_token_id=EOS, length_penalty=1.0) == -2.0
    assert beam_search.score(beam, prompt_len=1, eos_token_id=EOS, length_penalty=0.0) == -6.0
