"""One soak request and its outcome. Progress is any byte from the server: a request with
no progress for `stall_s` is hung (httpx's read timeout measures exactly that: the time
waiting for the next bytes, headers included)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass

import httpx

from tools.bench.sse import SseDecoder
from tools.soak.workload import Ending, Scenario


@dataclass(frozen=True)
class Outcome:
    scenario: Scenario
    # completed | aborted | hung | error
    result: str
    # For errors: the HTTP status ("503"), "stream_error" (an error event in a 200 stream),
    # "truncated" (a stream that ended without [DONE]) or "transport:<exception>".
    detail: str = ""
    seconds: float = 0.0
    message: str = ""  # the start of an error's body, to tell errors of one status apart


async def run_one(client: httpx.AsyncClient, base_url: str, scenario: Scenario, stall_s: float) -> Outcome:
    loop = asyncio.get_running_loop()
    started = loop.time()
    task = asyncio.create_task(_request(client, base_url, scenario, stall_s))
    if scenario.ending is Ending.DISCONNECT_EARLY:
        done, _pending = await asyncio.wait({task}, timeout=scenario.disconnect_after_s)
        if not done:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return Outcome(scenario, "aborted", "disconnected early", loop.time() - started)
    result, detail, message = await task
    return Outcome(scenario, result, detail, loop.time() - started, message)


async def _request(
    client: httpx.AsyncClient, base_url: str, scenario: Scenario, stall_s: float
) -> tuple[str, str, str]:
    timeout = httpx.Timeout(connect=10.0, read=stall_s, write=10.0, pool=None)
    try:
        async with client.stream(
            "POST", base_url + scenario.path, json=scenario.body, timeout=timeout
        ) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return "error", str(response.status_code), text[:300]
            if not scenario.stream:
                body = json.loads(await response.aread())
                return (
                    ("completed", "", "") if body.get("choices") else ("error", "no choices", str(body)[:300])
                )
            return await _read_stream(response, scenario)
    except httpx.ReadTimeout:
        return "hung", f"no bytes for {stall_s:.0f}s", ""
    except httpx.HTTPError as error:
        return "error", f"transport:{type(error).__name__}", str(error)[:300]
    except ValueError as error:  # a body that is not the JSON it should be
        return "error", "bad body", str(error)[:300]


async def _read_stream(response: httpx.Response, scenario: Scenario) -> tuple[str, str, str]:
    decoder = SseDecoder()
    chunks = 0
    async for line in response.aiter_lines():
        event = decoder.feed(line)
        if event is None:
            continue
        if event.data == "[DONE]":
            return "completed", "", ""
        if '"error"' in event.data and "error" in json.loads(event.data):
            return "error", "stream_error", event.data[:300]
        chunks += 1
        if scenario.ending is Ending.ABORT_MID_STREAM and chunks >= scenario.abort_after_chunks:
            # Leaving the `async with` closes the connection mid-stream: a client gone away.
            return "aborted", f"after {chunks} chunks", ""
    return "error", "truncated", ""
