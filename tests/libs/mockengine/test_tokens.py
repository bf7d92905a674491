"""Output tokens depend only on (sampling key, context): deterministic, equal for greedy
requests everywhere, and a migrated request continues exactly as the uninterrupted run."""

from __future__ import annotations

import pytest

from libs.mockengine.tokens import TokenModel, context_hash, extend_context, sampling_key
from tests.libs.mockengine.helpers import add, run, simulator, tokens_by_request

PROMPT = list(range(500, 540))


def generate(prompt: list[int], eos_probability: float = 0.0, **sampling: object) -> list[int]:
    sim = simulator(max_model_len=64, eos_probability=eos_probability)
    add(sim, "r", prompt, **sampling)
    return tokens_by_request(run(sim))[("r", 0)]


def test_the_same_request_gives_the_same_tokens() -> None:
    assert generate(PROMPT, max_tokens=12) == generate(PROMPT, max_tokens=12)
    assert generate(PROMPT, max_tokens=12, temperature=0.8, seed=3) == generate(
        PROMPT, max_tokens=12, temperature=0.8, seed=3
    )


def test_greedy_ignores_the_seed_and_sampling_depends_on_it() -> None:
    greedy = generate(PROMPT, max_tokens=8, temperature=0.0, seed=1)
    assert greedy == generate(PROMPT, max_tokens=8, temperature=0.0, seed=2)
    sampled = generate(PROMPT, max_tokens=8, temperature=1.0, seed=1)
    assert sampled != greedy
    assert sampled != generate(PROMPT, max_tokens=8, temperature=1.0, seed=2)


def test_unseeded_sampling_is_not_repeatable() -> None:
    assert generate(PROMPT, max_tokens=8, temperature=1.0) != generate(PROMPT, max_tokens=8, temperature=1.0)


def test_different_prompts_give_different_tokens() -> None:
    assert generate(PROMPT, max_tokens=8) != generate([*PROMPT[:-1], 7], max_tokens=8)


@pytest.mark.parametrize("moved", [1, 5, 11])
@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 1.0, "seed": 9}])
def test_a_migrated_request_continues_as_the_uninterrupted_run(
    moved: int, sampling: dict[str, object]
) -> None:
    """The gateway moves a request with prompt + the tokens already sent, max_tokens and
    min_tokens less those (docs/architecture.md, Migration)."""
    eos = 0.08  # EOS may come, but not within min_tokens: both runs must agree on where
    whole = generate(PROMPT, eos, max_tokens=20, min_tokens=4, **sampling)
    assert len(whole) > moved
    continued = generate(
        PROMPT + whole[:moved], eos, max_tokens=20 - moved, min_tokens=max(4 - moved, 0), **sampling
    )
    assert whole[:moved] + continued == whole


def test_the_context_hash_is_incremental() -> None:
    assert extend_context(context_hash([1, 2]), [3, 4]) == context_hash([1, 2, 3, 4])
    assert context_hash([1, 2]) != context_hash([2, 1])


def test_tokens_stay_in_the_vocabulary_and_avoid_eos_and_banned_ones() -> None:
    model = TokenModel(vocab_size=5, eos_token_id=2)
    key = sampling_key(temperature=1.0, seed=1, index=0)
    drawn = {model.next_token(context_hash([i]), key, banned=frozenset({3})) for i in range(200)}
    assert drawn == {0, 1, 4}


def test_eos_comes_at_about_its_probability() -> None:
    model = TokenModel(vocab_size=1000, eos_token_id=2, eos_probability=0.25)
    draws = [model.next_token(context_hash([i]), 0) for i in range(4000)]
    assert 0.22 < draws.count(2) / len(draws) < 0.28


def test_logprobs_rank_the_sampled_token_first() -> None:
    model = TokenModel(vocab_size=1000, eos_token_id=2)
    entry = model.logprobs(context_hash([1]), 0, 17, 3)
    assert entry.token_ids[0] == 17 and entry.ranks == [1, 2, 3]
    assert entry.logprobs[0] <= 0 and entry.logprobs == sorted(entry.logprobs, reverse=True)
    assert model.logprobs(context_hash([1]), 0, 17, 3) == entry


def test_prompt_logprobs_have_vllms_shape() -> None:
    model = TokenModel(vocab_size=1000, eos_token_id=2)
    entries = model.prompt_logprobs([5, 6, 7], 2)
    assert entries[0] is None
    assert [e.token_ids[0] for e in entries[1:] if e] == [6, 7]
    assert all(e is not None and len(e.token_ids) == 3 for e in entries[1:])
