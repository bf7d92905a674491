"""Resuming: what an existing output file already answers, and what of the input is left.

Every output line is written whole in one append, so a run killed at any moment leaves
complete lines plus, at worst, a torn last line. `load_done` cuts that torn tail off the file
(its request is simply run again) and reads the rest.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.run_batch.batch_format import (
    DUPLICATE_PREFIX,
    BatchRequest,
    InvalidLine,
    duplicate_message,
    local_error_record,
    parse_line,
)


@dataclass
class Done:
    """What the output file already holds."""

    answered_ids: set[str] = field(default_factory=set)  # a result or error line for the request
    duplicate_reports: Counter[str] = field(default_factory=Counter)  # error lines for repeats
    # Lines that named no custom_id are known by their error message (it names the line).
    unidentified_errors: set[str] = field(default_factory=set)
    lines: int = 0
    unreadable_lines: int = 0  # complete but not JSON: left in place, their ids redone
    truncated_bytes: int = 0  # a torn tail cut off


def _is_duplicate_report(record: dict[str, Any]) -> bool:
    error = record.get("error")
    return isinstance(error, str) and error.startswith(DUPLICATE_PREFIX)


def _read_record(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) and "custom_id" in record else None


def _complete_length(data: bytes) -> int:
    """How many leading bytes of the file to keep: up to the last newline, and not a final
    line that does not parse (a torn write that happens to end in a newline byte)."""
    end = data.rfind(b"\n") + 1
    while end > 0:
        start = data.rfind(b"\n", 0, end - 1) + 1
        if _read_record(data[start:end]) is not None:
            break
        end = start
    return end


def load_done(path: Path) -> Done:
    """Reads the output file, truncating a torn tail; a missing file means nothing done."""
    done = Done()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return done
    keep = _complete_length(data)
    if keep < len(data):
        with path.open("r+b") as handle:
            handle.truncate(keep)
            handle.flush()
            os.fsync(handle.fileno())
        done.truncated_bytes = len(data) - keep
    for line in data[:keep].splitlines():
        if not line.strip():
            continue
        record = _read_record(line)
        if record is None:
            done.unreadable_lines += 1
            continue
        done.lines += 1
        custom_id = record["custom_id"]
        if not isinstance(custom_id, str):
            if isinstance(record.get("error"), str):
                done.unidentified_errors.add(record["error"])
        elif _is_duplicate_report(record):
            done.duplicate_reports[custom_id] += 1
        else:
            done.answered_ids.add(custom_id)
    return done


@dataclass
class Plan:
    """This run's work: requests to send and error lines to write without sending."""

    requests: list[BatchRequest] = field(default_factory=list)
    refusals: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0  # already answered in the output file

    @property
    def to_handle(self) -> int:
        return len(self.requests) + len(self.refusals)


def plan(lines: Iterable[str], done: Done) -> Plan:
    result = Plan()
    first_line: dict[str, int] = {}
    repeats_seen: Counter[str] = Counter()
    for line_number, text in enumerate(lines, start=1):
        item = parse_line(text, line_number)
        if item is None:
            continue
        if item.custom_id is None:
            assert isinstance(item, InvalidLine)
            if item.message in done.unidentified_errors:
                result.skipped += 1
            else:
                result.refusals.append(local_error_record(None, item.message))
            continue
        custom_id = item.custom_id
        if custom_id in first_line:
            repeats_seen[custom_id] += 1
            if repeats_seen[custom_id] <= done.duplicate_reports[custom_id]:
                result.skipped += 1
            else:
                message = duplicate_message(custom_id, line_number, first_line[custom_id])
                result.refusals.append(local_error_record(custom_id, message))
            continue
        first_line[custom_id] = line_number
        if custom_id in done.answered_ids:
            result.skipped += 1
        elif isinstance(item, InvalidLine):
            result.refusals.append(local_error_record(custom_id, item.message))
        else:
            result.requests.append(item)
    return result
