from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from tools.bench import words
from tools.bench.config import WORKLOADS, WorkloadConfig, WorkloadName
from tools.bench.workloads import Session, sample_length, sessions


def take(config: WorkloadConfig, seed: int, n: int) -> list[Session]:
    return list(itertools.islice(sessions(config, seed), n))


@pytest.mark.parametrize("name", WORKLOADS)
def test_same_seed_same_sessions_other_seed_other_sessions(name: WorkloadName) -> None:
    config = WorkloadConfig(
        name=name, input_len=20, output_len=5, len_spread=0.5, prefix_len=30, suffix_len=5
    )
    first = take(config, 7, 25)
    assert first == take(config, 7, 25)
    assert first != take(config, 8, 25)
    assert [s.session_id for s in first] == list(range(25))


def test_random_lengths_match_text_and_stay_in_spread() -> None:
    exact = take(WorkloadConfig(input_len=40, output_len=9), 0, 50)
    assert {(t.input_len, t.max_tokens) for s in exact for t in s.turns} == {(40, 9)}
    spread = take(WorkloadConfig(input_len=100, output_len=20, len_spread=0.5), 0, 300)
    turns = [t for s in spread for t in s.turns]
    for turn in turns:
        assert len(turn.text.split()) == turn.input_len
        assert set(turn.text.split()) <= set(words.WORDS)
    inputs = [t.input_len for t in turns]
    outputs = [t.max_tokens for t in turns]
    assert 50 <= min(inputs) < 60 and 140 < max(inputs) <= 150
    assert min(outputs) >= 10 and max(outputs) <= 30
    assert abs(np.mean(inputs) - 100) < 5


def test_sample_length_never_below_one() -> None:
    rng = np.random.default_rng(0)
    # 2 ± 90% spans 0.2..3.8: the low end is clamped to 1 token.
    assert {sample_length(rng, 2, 0.9) for _ in range(200)} == {1, 2, 3, 4}


def test_prefix_requests_share_exactly_the_configured_prefixes() -> None:
    config = WorkloadConfig(name="prefix", num_prefixes=3, prefix_len=25, suffixes_per_prefix=4, suffix_len=6)
    round_one = [s.turns[0] for s in take(config, 1, 12)]
    prefixes = Counter(" ".join(t.text.split()[:25]) for t in round_one)
    assert len(prefixes) == 3 and set(prefixes.values()) == {4}
    assert all(t.input_len == 31 == len(t.text.split()) for t in round_one)
    # Shuffled, not grouped: the first four requests do not all share one prefix.
    assert len({" ".join(t.text.split()[:25]) for t in round_one[:4]}) > 1
    # Later rounds reuse the same prefixes with new suffixes.
    round_two = [s.turns[0] for s in take(config, 1, 24)[12:]]
    assert Counter(" ".join(t.text.split()[:25]) for t in round_two) == prefixes
    assert {t.text for t in round_two}.isdisjoint(t.text for t in round_one)


def test_multiturn_sessions_have_the_configured_turns() -> None:
    for session in take(WorkloadConfig(name="multiturn", turns=3, input_len=8, output_len=4), 0, 10):
        assert len(session.turns) == 3
        assert all(t.input_len == 8 and t.max_tokens == 4 for t in session.turns)


def test_long_interference_mixes_in_the_configured_fraction_of_long_prompts() -> None:
    config = WorkloadConfig(name="long-interference", input_len=10, long_input_len=2000, long_fraction=0.1)
    lengths = [s.turns[0].input_len for s in take(config, 3, 2000)]
    assert set(lengths) == {10, 2000}
    # Binomial(2000, 0.1): mean 200, sd ~13.4; 150..250 is beyond 3.5 sd either way.
    assert 150 <= lengths.count(2000) <= 250


def test_invalid_workload_config_is_refused() -> None:
    with pytest.raises(ValueError, match="input_len must be >= 1"):
        WorkloadConfig(input_len=0)
    with pytest.raises(ValueError, match="len_spread"):
        WorkloadConfig(len_spread=1.0)
