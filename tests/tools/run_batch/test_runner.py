"""The runner against in-process fake servers (httpx's mock transport): output lines, error
lines, concurrency, and stopping when the server is gone."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from tools.run_batch.runner import RunOptions, run_batch

pytestmark = pytest.mark.anyio

Handler = Callable[[httpx.Request], Coroutine[None, None, httpx.Response]]


def write_batch(path: Path, lines: Sequence[dict[str, Any] | str]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def chat(custom_id: str, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "m", **body},
    }


def read_output(path: Path) -> dict[str, dict[str, Any]]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    by_id = {r["custom_id"]: r for r in records}
    assert len(by_id) == len(records), "one line per custom_id"
    return by_id


async def run(tmp_path: Path, lines: Sequence[dict[str, Any] | str], handler: Handler, **options: Any) -> Any:
    batch = write_batch(tmp_path / "batch.jsonl", lines)
    run_options = RunOptions(base_url="http://fake", progress=False, **options)
    return await run_batch(batch, tmp_path / "out.jsonl", run_options, transport=httpx.MockTransport(handler))


async def test_answers_and_http_errors_become_output_lines(tmp_path: Path) -> None:
    sent: list[dict[str, Any]] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        if body["messages"] == "fail":
            return httpx.Response(
                500, json={"error": {"message": "boom", "type": "server_error", "param": None, "code": 500}}
            )
        if body["messages"] == "html":
            return httpx.Response(502, text="<html>bad gateway</html>")
        return httpx.Response(
            200, json={"object": "chat.completion", "echo": body["messages"], "path": request.url.path}
        )

    lines: list[dict[str, Any] | str] = [
        chat("ok", messages="hi"),
        chat("fail", messages="fail"),
        chat("html", messages="html"),
    ]
    summary = await run(tmp_path, lines, handler)
    assert (summary.total, summary.succeeded, summary.errors, summary.not_done) == (3, 1, 2, 0)
    out = read_output(tmp_path / "out.jsonl")
    assert out["ok"]["response"]["status_code"] == 200 and out["ok"]["error"] is None
    assert out["ok"]["response"]["body"] == {
        "object": "chat.completion",
        "echo": "hi",
        "path": "/v1/chat/completions",
    }
    assert out["fail"]["response"] == {**out["fail"]["response"], "status_code": 500, "body": None}
    assert out["fail"]["error"]["error"]["message"] == "boom"
    assert out["html"]["response"]["status_code"] == 502
    assert out["html"]["error"]["error"]["message"] == "<html>bad gateway</html>"
    # Sent as written, with streaming explicitly off.
    assert all(body["stream"] is False and body["model"] == "m" for body in sent)


async def test_refused_lines_are_written_without_being_sent(tmp_path: Path) -> None:
    sent: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content)["messages"])
        return httpx.Response(200, json={})

    lines: list[dict[str, Any] | str] = [
        chat("a", messages="a"),
        "not json",
        chat("streamed", messages="s", stream=True),
        chat("a", messages="again"),
    ]
    summary = await run(tmp_path, lines, handler)
    assert sent == ["a"]
    assert (summary.succeeded, summary.errors) == (1, 3)
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    errors = {(r["custom_id"], r["error"]) for r in records if r["error"]}
    assert errors == {
        (None, "input line 2: not valid JSON (Expecting value: line 1 column 1 (char 0))"),
        ("streamed", "Request must not be sent in stream mode"),
        ("a", "duplicate custom_id: 'a' on input line 4 was already used on line 1"),
    }


async def test_no_more_than_concurrency_requests_are_in_flight(tmp_path: Path) -> None:
    in_flight = 0
    most = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return httpx.Response(200, json={})

    summary = await run(tmp_path, [chat(str(i), messages="x") for i in range(40)], handler, concurrency=5)
    assert summary.succeeded == 40
    assert most == 5
    assert len(read_output(tmp_path / "out.jsonl")) == 40


async def test_a_timeout_is_that_lines_error(tmp_path: Path) -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["messages"] == "slow":
            raise httpx.ReadTimeout("timed out", request=request)
        return httpx.Response(200, json={})

    summary = await run(
        tmp_path, [chat("slow", messages="slow"), chat("fast", messages="fast")], handler, timeout_s=3
    )
    assert (summary.succeeded, summary.errors) == (1, 1)
    out = read_output(tmp_path / "out.jsonl")
    assert out["slow"]["response"] is None and out["slow"]["error"] == "no answer within 3 s"


async def test_an_unreachable_server_stops_the_run_and_leaves_the_rest_for_later(tmp_path: Path) -> None:
    calls = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if json.loads(request.content)["messages"] != "first":
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json={})

    lines = [chat("first", messages="first"), *(chat(f"r{i}", messages="x") for i in range(20))]
    summary = await run(tmp_path, lines, handler, concurrency=1, connect_retries=1)
    assert summary.succeeded == 1 and summary.errors == 0
    assert summary.not_done == 20 and "ConnectError" in summary.stopped_because
    assert calls == 1 + 2  # the first line, then one line tried twice
    assert list(read_output(tmp_path / "out.jsonl")) == ["first"]

    # The server is back: the next run sends only the 20 lines not done.
    sent: list[str] = []

    async def back(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content)["messages"])
        return httpx.Response(200, json={})

    resumed = await run(tmp_path, lines, back)
    assert (resumed.skipped, resumed.succeeded, resumed.not_done) == (1, 20, 0)
    assert len(sent) == 20 and "first" not in sent
    assert len(read_output(tmp_path / "out.jsonl")) == 21
