"""Outcome counts for `pytest --hypothesis-show-statistics`: how many examples got past the
first check, so that a strategy that only ever produces refusals is noticed."""

from __future__ import annotations

from hypothesis import event
from hypothesis.control import currently_in_test_context


def outcome(label: str) -> None:
    if currently_in_test_context():  # also called from plain (non-hypothesis) tests
        event(label)
