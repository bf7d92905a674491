"""The command line: which arguments go to the gateway, refused combinations, the summary."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.cli_args import split_gateway_args, user_path
from tools.run_batch.main import main, report
from tools.run_batch.runner import Summary


def test_flags_after_a_double_dash_are_the_gateways() -> None:
    assert split_gateway_args(["-i", "a", "-o", "b", "--", "--mode", "pd", "--", "x"]) == (
        ["-i", "a", "-o", "b"],
        ["--mode", "pd", "--", "x"],
    )
    assert split_gateway_args(["-i", "a"]) == (["-i", "a"], [])


def test_gateway_flags_cannot_go_with_a_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    batch = tmp_path / "in.jsonl"
    batch.write_text("")
    argv = ["-i", str(batch), "-o", str(tmp_path / "out"), "--url", "http://h:1", "--gateway-arg=--mode"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "cannot go with --url" in capsys.readouterr().err


def test_a_missing_input_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["-i", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "out"), "--url", "http://h:1"])
    assert "no input file" in capsys.readouterr().err


def test_the_summary_says_what_is_left_and_how_to_finish() -> None:
    finished = report(Summary(total=10, skipped=4, succeeded=5, errors=1), Path("o.jsonl"))
    assert finished == "run_batch: 10 lines: 5 ok, 1 error lines, 4 already in the output; output: o.jsonl"
    stopped = report(
        Summary(total=10, skipped=0, succeeded=2, not_done=8, stopped_because="server unreachable: x"),
        Path("o.jsonl"),
    )
    assert "stopped, 8 lines not done (server unreachable: x); run the same command again" in stopped


def test_relative_paths_are_the_users_under_bazel_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BUILD_WORKING_DIRECTORY", "/home/me/work")
    assert user_path(Path("batch.jsonl")) == Path("/home/me/work/batch.jsonl")
    assert user_path(Path("/tmp/batch.jsonl")) == Path("/tmp/batch.jsonl")
    monkeypatch.delenv("BUILD_WORKING_DIRECTORY")
    assert user_path(Path("batch.jsonl")) == Path("batch.jsonl")
