"""tools/bench/speculative.py: speed-ups summarised over rounds."""

from __future__ import annotations

from tools.bench.speculative import Result, rounds_summary


def _result(name: str, seconds: float, first_token_seconds: float = 0.0) -> Result:
    # 6 requests of 100 tokens: tok/s = 600 / seconds.
    return Result(name, 600, seconds, first_token_seconds, 6, {"drafts": 0})


def test_each_ratio_is_taken_within_its_round_then_summarised() -> None:
    rounds = [
        [_result("plain", 30.0), _result("ngram-8", 10.0)],  # 20 and 60 tok/s: 3.0x
        [_result("plain", 60.0), _result("ngram-8", 12.0)],  # a slow plain round: 10 and 50, 5.0x
        [_result("plain", 30.0), _result("ngram-8", 20.0)],  # a slow n-gram round: 20 and 30, 1.5x
    ]
    header, plain, ngram = rounds_summary(rounds)
    assert header.split()[0] == "system"
    assert plain.split() == ["plain", "3", "1.00x", "[1.00-1.00]", "1.00x", "[1.00-1.00]"]
    # Within rounds, then the median: 3.0x. The ratio of the medians would be 50 / 20 = 2.5x,
    # of the means 46.7 / 16.7 = 2.8x.
    assert ngram.split()[:4] == ["ngram-8", "3", "3.00x", "[1.50-5.00]"]


def test_decode_ratio_leaves_out_the_first_tokens() -> None:
    # plain: (600 - 6) / (30 - 3) = 22 tok/s decode; ngram: (600 - 6) / (12 - 3) = 66 -> 3.00x.
    rounds = [[_result("plain", 30.0, 3.0), _result("ngram-8", 12.0, 3.0)]]
    ngram = rounds_summary(rounds)[2].split()
    assert ngram[2:4] == ["2.50x", "[2.50-2.50]"]
    assert ngram[4:6] == ["3.00x", "[3.00-3.00]"]
