"""The tool as a user runs it, a subprocess, against the reference server (an OpenAI server
with known delays, in this process so that it can count what it was sent): a 1,000-line batch
completes with one line per id, and a batch SIGKILLed midway finishes on the next run
without sending any finished line again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.tools.bench.fake_openai import MODEL, FakeOpenAI, serve

LINES = 1000
CONCURRENCY = 8


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with serve(FakeOpenAI(ttft_s=0.03, itl_s=0.01)) as server:
        yield server


def batch_line(index: int, *, url: str | None = None, max_tokens: int | None = 3) -> str:
    custom_id = f"req-{index}"
    chat = index % 2 == 0
    body: dict[str, Any] = {"model": MODEL, "user": custom_id}  # `user`: the server sees the id
    if chat:
        body["messages"] = [{"role": "user", "content": f"question {index}"}]
    else:
        body["prompt"] = f"prompt {index}"
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    url = url or ("/v1/chat/completions" if chat else "/v1/completions")
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def start_tool(fake: FakeOpenAI, batch: Path, output: Path, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    argv = [sys.executable, "-m", "tools.run_batch.main", "-i", str(batch), "-o", str(output)]
    argv += ["--url", fake.url, "--concurrency", str(CONCURRENCY)]
    with log.open("ab") as handle:
        return subprocess.Popen(
            argv, env=env, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )


def finish(process: subprocess.Popen[bytes], log: Path) -> None:
    assert process.wait(timeout=240) == 0, log.read_text()


def records(output: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.read_text().splitlines()]


def sent_ids(fake: FakeOpenAI, since: int = 0) -> list[str]:
    return [body["user"] for body in fake.bodies[since:]]


def test_a_1000_line_batch_gets_one_line_per_id(fake: FakeOpenAI, tmp_path: Path) -> None:
    unsupported = set(range(0, LINES, 200))  # 5 lines the tool refuses itself
    no_max_tokens = set(range(7, LINES, 100))  # 10 lines the server answers with 400
    lines = [
        batch_line(
            i,
            url="/v1/embeddings" if i in unsupported else None,
            max_tokens=None if i in no_max_tokens else 3,
        )
        for i in range(LINES)
    ]
    batch, output, log = tmp_path / "batch.jsonl", tmp_path / "out.jsonl", tmp_path / "tool.log"
    batch.write_text("\n".join(lines) + "\n")
    finish(start_tool(fake, batch, output, log), log)

    out = records(output)
    assert Counter(r["custom_id"] for r in out) == Counter(f"req-{i}" for i in range(LINES))
    by_id = {r["custom_id"]: r for r in out}
    for i in range(LINES):
        record = by_id[f"req-{i}"]
        if i in unsupported:
            assert record["response"]["status_code"] == 400 and record["error"].startswith(
                "URL /v1/embeddings"
            )
        elif i in no_max_tokens:
            assert record["response"]["status_code"] == 400
            assert record["error"]["error"]["message"] == "max_tokens is required here"
        else:
            assert record["error"] is None and record["response"]["status_code"] == 200
            choice = record["response"]["body"]["choices"][0]
            assert (choice["message"]["content"] if i % 2 == 0 else choice["text"]) == " w0 w1 w2"
    # The server was sent every line it should be, once.
    expected = Counter(f"req-{i}" for i in range(LINES) if i not in unsupported)
    assert Counter(sent_ids(fake)) == expected
    assert "1000 lines: 985 ok, 15 error lines" in log.read_text()

    # Run again: everything is in the output already; nothing is sent or written.
    size = output.stat().st_size
    finish(start_tool(fake, batch, output, log), log)
    assert len(fake.bodies) == sum(expected.values())
    assert output.stat().st_size == size


def test_a_batch_killed_midway_finishes_on_the_next_run_without_redoing_lines(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    batch, output, log = tmp_path / "batch.jsonl", tmp_path / "out.jsonl", tmp_path / "tool.log"
    batch.write_text("\n".join(batch_line(i) for i in range(LINES)) + "\n")
    all_ids = {f"req-{i}" for i in range(LINES)}

    process = start_tool(fake, batch, output, log)
    deadline = time.monotonic() + 120
    while not output.exists() or output.read_bytes().count(b"\n") < 250:
        assert process.poll() is None, f"finished before it could be killed:\n{log.read_text()}"
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    data = output.read_bytes()
    complete = data[: data.rfind(b"\n") + 1].splitlines(keepends=True)
    assert 250 <= len(complete) < LINES, "killed midway"
    # A write torn by the kill: the last line's second half never reached the file.
    torn = complete[-1]
    output.write_bytes(b"".join(complete[:-1]) + torn[: len(torn) // 2])
    done_before = {json.loads(line)["custom_id"] for line in complete[:-1]}
    torn_id = json.loads(torn)["custom_id"]
    sent_before = len(fake.bodies)
    assert set(sent_ids(fake)) >= done_before | {torn_id}

    finish(start_tool(fake, batch, output, log), log)

    out = records(output)  # every line parses: the torn one was cut off
    assert Counter(r["custom_id"] for r in out) == Counter(all_ids)
    assert all(r["error"] is None for r in out)
    resent = sent_ids(fake, since=sent_before)
    assert not set(resent) & done_before, "a finished line was sent again"
    assert len(resent) == len(set(resent)) == LINES - len(done_before)
    assert torn_id in resent
    # Sent twice in all: only what was in flight at the kill, and the torn line.
    assert len(fake.bodies) - LINES <= CONCURRENCY + 1
    assert "cut off and redone" in log.read_text()
