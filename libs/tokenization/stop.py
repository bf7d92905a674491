"""Stop strings over streamed text deltas.

Engines stop on token ids; stop *strings* can span tokens and deltas, so they
are matched here on text. Text that could still turn out to be the start of a
stop string is held back, so a client never receives text past a stop.
"""

from collections.abc import Sequence
from typing import NamedTuple


class StopResult(NamedTuple):
    text: str  # text to send to the client now
    stopped: bool  # a stop string completed: the request should end
    matched_stop: str | None  # the stop string that completed, if any


class StopStringMatcher:
    """Feeds text deltas through; finds the first stop string to complete.

    When several stop strings could match, the one that completes first in
    the text wins (that is where a token-by-token stream would have stopped,
    so the result does not depend on how the text was split into deltas); of
    those completing at the same character, the one starting earliest wins,
    so no text of any completed stop string is emitted.
    """

    def __init__(self, stops: Sequence[str], include_stop_str_in_output: bool = False) -> None:
        if isinstance(stops, str):
            # A bare string would be taken as a list of one-char stops.
            raise ValueError("stops must be a list of strings, not a string")
        for stop in stops:
            if not isinstance(stop, str) or not stop:
                raise ValueError(f"stop strings must be non-empty strings, got {stop!r}")
        self._stops: tuple[str, ...] = tuple(dict.fromkeys(stops))
        self._include_stop = include_stop_str_in_output
        self._held = ""
        self._matched: str | None = None

    @property
    def stopped(self) -> bool:
        return self._matched is not None

    def process(self, delta: str) -> StopResult:
        """Takes the next text delta; returns what may be emitted."""
        if self._matched is not None:
            return StopResult("", True, self._matched)
        text = self._held + delta
        match = self._first_match(text)
        if match is not None:
            start, stop = match
            self._matched = stop
            self._held = ""
            end = start + len(stop) if self._include_stop else start
            return StopResult(text[:end], True, stop)
        held_len = self._partial_stop_len(text)
        self._held = text[len(text) - held_len :]
        return StopResult(text[: len(text) - held_len], False, None)

    def flush(self) -> str:
        """At the end of the stream: releases the held text (it never became a stop)."""
        held, self._held = self._held, ""
        return held

    def _first_match(self, text: str) -> tuple[int, str] | None:
        # Only text + held can hold a match: held text had none when it came.
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for stop in self._stops:
            # For one stop, its first occurrence is also its first to end.
            start = text.find(stop)
            if start < 0:
                continue
            candidate = (start + len(stop), start, stop)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
        return None if best is None else (best[1], best[2])

    def _partial_stop_len(self, text: str) -> int:
        """Length of the longest suffix of text that is a proper prefix of a stop.

        Runs on every token of every stream with stops, so it works in C-level string
        searches: per stop, only positions holding the stop's first character within its
        length of the end are tried, leftmost (longest) first. Ordinary text has none, so a
        token costs about one `find` per stop, however many and long the stops are.
        """
        best = 0
        for stop in self._stops:
            position = text.find(stop[0], max(len(text) - len(stop) + 1, 0))
            while position >= 0 and len(text) - position > best:
                if stop.startswith(text[position:]):
                    best = len(text) - position
                    break
                position = text.find(stop[0], position + 1)
        return best
