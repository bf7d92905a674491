"""StopStringMatcher: stops spanning deltas, hold-back, precedence, flush."""

import itertools
import random
from collections.abc import Sequence

import pytest

from libs.tokenization.stop import StopResult, StopStringMatcher


def _run(matcher: StopStringMatcher, deltas: Sequence[str]) -> tuple[str, bool, str | None]:
    """Streams deltas until a stop; returns (all emitted text, stopped, matched)."""
    out: list[str] = []
    for delta in deltas:
        result = matcher.process(delta)
        out.append(result.text)
        if result.stopped:
            return "".join(out), True, result.matched_stop
    out.append(matcher.flush())
    return "".join(out), False, None


def _reference(text: str, stops: Sequence[str], include: bool) -> tuple[str, str | None]:
    """Non-streaming answer: the stop that completes first (then starts first) wins."""
    best: tuple[int, int, str] | None = None
    for stop in stops:
        start = text.find(stop)
        if start >= 0 and (best is None or (start + len(stop), start) < best[:2]):
            best = (start + len(stop), start, stop)
    if best is None:
        return text, None
    end, start, stop = best
    return text[: end if include else start], stop


def _splits(text: str) -> list[list[str]]:
    """Every way to cut text into three (possibly empty) consecutive deltas."""
    cuts = range(len(text) + 1)
    return [[text[:i], text[i:j], text[j:]] for i in cuts for j in cuts if i <= j]


def test_no_stops_passes_text_through() -> None:
    matcher = StopStringMatcher([])
    assert matcher.process("Hello") == StopResult("Hello", False, None)
    assert matcher.process(" world") == StopResult(" world", False, None)
    assert matcher.flush() == ""


def test_stop_inside_one_delta() -> None:
    matcher = StopStringMatcher(["STOP"])
    assert matcher.process("Hello STOP world") == StopResult("Hello ", True, "STOP")
    assert matcher.stopped


@pytest.mark.parametrize("include", [False, True])
def test_stop_split_across_deltas_at_every_position(include: bool) -> None:
    text = "Hello world<|end|> and text that must never be sent"
    expected = "Hello world<|end|>" if include else "Hello world"
    for deltas in _splits(text):
        matcher = StopStringMatcher(["<|end|>"], include_stop_str_in_output=include)
        assert _run(matcher, deltas) == (expected, True, "<|end|>"), deltas


def test_stop_arriving_one_char_at_a_time_holds_partial_text() -> None:
    matcher = StopStringMatcher(["<|end|>"])
    emitted = [matcher.process(char).text for char in "ab<|en"]
    # "<|en" could still become the stop, so only "ab" went out.
    assert "".join(emitted) == "ab"
    assert matcher.process("d|>zz") == StopResult("", True, "<|end|>")


def test_flush_releases_held_text_that_never_became_a_stop() -> None:
    matcher = StopStringMatcher(["<|end|>"])
    assert matcher.process("Hello <|en").text == "Hello "
    assert matcher.flush() == "<|en"
    assert matcher.flush() == ""


def test_held_text_released_when_it_stops_matching() -> None:
    matcher = StopStringMatcher(["STOP"])
    assert matcher.process("ST").text == ""
    assert matcher.process("ART").text == "START"


def test_repeated_prefix_of_stop() -> None:
    for deltas in _splits("xSTSTOPy"):
        assert _run(StopStringMatcher(["STOP"]), deltas) == ("xST", True, "STOP"), deltas


def test_stop_at_very_start() -> None:
    for deltas in _splits("STOP then more"):
        assert _run(StopStringMatcher(["STOP"]), deltas) == ("", True, "STOP"), deltas
    matcher = StopStringMatcher(["STOP"], include_stop_str_in_output=True)
    assert matcher.process("STOP then more") == StopResult("STOP", True, "STOP")


def test_multiple_stops_earliest_wins_whatever_the_list_order() -> None:
    text = "one two STOP1 three STOP2"
    for stops in (["STOP1", "STOP2"], ["STOP2", "STOP1"]):
        for deltas in _splits(text):
            assert _run(StopStringMatcher(stops), deltas) == ("one two ", True, "STOP1")


def test_overlapping_stops_first_to_complete_wins() -> None:
    # "bc" completes before "abcd" does, in any split of the text.
    for deltas in _splits("xabcdy"):
        assert _run(StopStringMatcher(["abcd", "bc"]), deltas) == ("xa", True, "bc")


def test_stops_completing_together_the_longer_wins() -> None:
    for deltas in _splits("xabcy"):
        assert _run(StopStringMatcher(["bc", "abc"]), deltas) == ("x", True, "abc")


def test_multibyte_stop_strings() -> None:
    for deltas in _splits("東京は日本の首都です。"):
        assert _run(StopStringMatcher(["首都"]), deltas) == ("東京は日本の", True, "首都")


def test_process_after_stop_emits_nothing() -> None:
    matcher = StopStringMatcher(["STOP"])
    matcher.process("aSTOPb")
    assert matcher.process("more") == StopResult("", True, "STOP")
    assert matcher.flush() == ""


@pytest.mark.parametrize("include", [False, True])
def test_random_texts_and_splits_match_non_streaming_reference(include: bool) -> None:
    rng = random.Random(1234)
    stops = ["aab", "ba", "bbb", "abab"]
    for _ in range(2000):
        text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 12)))
        active = rng.sample(stops, rng.randint(1, len(stops)))
        cuts = sorted(rng.randint(0, len(text)) for _ in range(rng.randint(0, 5)))
        deltas = [text[i:j] for i, j in itertools.pairwise([0, *cuts, len(text)])]
        expected_text, expected_stop = _reference(text, active, include)
        matcher = StopStringMatcher(active, include_stop_str_in_output=include)
        emitted, stopped, matched = _run(matcher, deltas)
        assert (emitted, matched) == (expected_text, expected_stop), (text, active, deltas)
        assert stopped == (expected_stop is not None)


def test_held_text_is_the_longest_suffix_that_may_still_become_a_stop() -> None:
    # Checked against a brute force over every suffix, one character at a time: each step
    # holds back exactly what could still complete a stop and releases the rest.
    rng = random.Random(99)
    for _ in range(300):
        stops = [
            "".join(rng.choice("ab") for _ in range(rng.randint(1, 8))) for _ in range(rng.randint(1, 5))
        ]
        text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 20)))
        matcher = StopStringMatcher(stops)
        seen = emitted = ""
        for char in text:
            result = matcher.process(char)
            if result.stopped:
                break
            seen, emitted = seen + char, emitted + result.text
            held = max(
                (
                    k
                    for k in range(1, len(seen) + 1)
                    if any(len(s) > k and s.startswith(seen[-k:]) for s in stops)
                ),
                default=0,
            )
            assert seen == emitted + seen[len(seen) - held :], (stops, seen, emitted)


def test_many_long_stop_strings_still_match_exactly() -> None:
    stops = [f"{i:03d}" + "x" * 1000 for i in range(64)]
    body = "y" * 5000 + "017" + "x" * 999  # one x short of stop 17
    matcher = StopStringMatcher(stops)
    emitted = "".join(matcher.process(body[i : i + 4]).text for i in range(0, len(body), 4))
    assert emitted == "y" * 5000 and matcher.flush() == "017" + "x" * 999
    emitted, stopped, matched = _run(StopStringMatcher(stops), [body, "x", "tail"])
    assert (emitted, stopped, matched) == ("y" * 5000, True, stops[17])


@pytest.mark.parametrize("bad", [[""], ["ok", ""], [None]])
def test_rejects_empty_or_non_string_stops(bad: list[str]) -> None:
    with pytest.raises(ValueError, match="non-empty strings"):
        StopStringMatcher(bad)


def test_rejects_a_bare_string() -> None:
    with pytest.raises(ValueError, match="not a string"):
        StopStringMatcher("STOP")
