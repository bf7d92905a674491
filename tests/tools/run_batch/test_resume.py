"""Resume: reading what an output file already answers (torn tails included) and planning
what of the input is left."""

from __future__ import annotations

import json
from pathlib import Path

from tools.run_batch.batch_format import encode, local_error_record, success_record
from tools.run_batch.resume import Done, load_done, plan


def request(custom_id: str, url: str = "/v1/completions") -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": {"prompt": custom_id}})


def test_a_missing_output_file_means_nothing_done(tmp_path: Path) -> None:
    assert load_done(tmp_path / "none.jsonl") == Done()


def test_answered_ids_include_error_lines(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    output.write_bytes(
        encode(success_record("a", 200, {})) + encode(local_error_record("b", "URL x was used"))
    )
    done = load_done(output)
    assert done.answered_ids == {"a", "b"} and done.lines == 2 and done.truncated_bytes == 0


def test_a_torn_last_line_is_cut_off_and_its_id_not_counted(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    whole = encode(success_record("a", 200, {}))
    torn = encode(success_record("b", 200, {"text": "long answer"}))[:25]
    output.write_bytes(whole + torn)
    done = load_done(output)
    assert done.answered_ids == {"a"}
    assert done.truncated_bytes == len(torn)
    assert output.read_bytes() == whole


def test_a_torn_line_that_happens_to_end_in_a_newline_is_cut_off_too(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    whole = encode(success_record("a", 200, {}))
    output.write_bytes(whole + b'{"id":"cleave-1","custom_id":"b","resp\n')
    assert load_done(output).answered_ids == {"a"}
    assert output.read_bytes() == whole


def test_an_unreadable_line_in_the_middle_stays_and_is_counted(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    last = encode(success_record("c", 200, {}))
    output.write_bytes(encode(success_record("a", 200, {})) + b"garbage\n" + last)
    done = load_done(output)
    assert done.answered_ids == {"a", "c"} and done.unreadable_lines == 1
    assert output.read_bytes().endswith(last)


def test_plan_skips_answered_ids_and_sends_the_rest() -> None:
    work = plan([request("a"), "", request("b"), request("c")], Done(answered_ids={"b"}))
    assert [r.custom_id for r in work.requests] == ["a", "c"]
    assert [r.line_number for r in work.requests] == [1, 4]
    assert work.skipped == 1 and work.refusals == [] and work.to_handle == 2


def test_plan_refuses_unsupported_lines_once() -> None:
    lines = [request("a", url="/v1/embeddings"), "{not json"]
    first = plan(lines, Done())
    assert first.requests == []
    assert [(r["custom_id"], r["error"][:20]) for r in first.refusals] == [
        ("a", "URL /v1/embeddings w"),
        (None, "input line 2: not va"),
    ]
    # A second run, after those error lines were written, refuses nothing again.
    done = Done(answered_ids={"a"}, unidentified_errors={first.refusals[1]["error"]})
    second = plan(lines, done)
    assert second.refusals == [] and second.requests == [] and second.skipped == 2


def test_a_repeated_custom_id_gets_an_error_line_and_is_sent_once(tmp_path: Path) -> None:
    lines = [request("a"), request("b"), request("a"), request("a")]
    work = plan(lines, Done())
    assert [r.custom_id for r in work.requests] == ["a", "b"]
    assert [r["error"] for r in work.refusals] == [
        "duplicate custom_id: 'a' on input line 3 was already used on line 1",
        "duplicate custom_id: 'a' on input line 4 was already used on line 1",
    ]
    # Killed after writing one duplicate report but before the request for "a" finished:
    # the request still runs, and only the second report is written again.
    output = tmp_path / "out.jsonl"
    output.write_bytes(encode(success_record("b", 200, {})) + encode(work.refusals[0]))
    resumed = plan(lines, load_done(output))
    assert [r.custom_id for r in resumed.requests] == ["a"]
    assert [r["error"] for r in resumed.refusals] == [work.refusals[1]["error"]]
    assert resumed.skipped == 2
