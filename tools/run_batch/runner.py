"""Runs a batch file against an OpenAI-compatible server: bounded concurrency, one output line
appended (and flushed) as each request finishes, so output order is completion order, and a
run killed at any point resumes where it stopped (tools/run_batch/resume.py)."""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from tools.run_batch.batch_format import (
    BatchRequest,
    encode,
    http_error_record,
    no_response_record,
    success_record,
)
from tools.run_batch.resume import load_done, plan


@dataclass(frozen=True)
class RunOptions:
    base_url: str  # http://host:port, without /v1
    concurrency: int = 16
    timeout_s: float = 600.0  # one request's whole answer; past it the line gets an error
    # A server that refuses connections or drops them is retried this often (with backoff)
    # before the run stops; the lines not done stay undone, for the next run to resume.
    connect_retries: int = 3
    progress: bool = True


@dataclass
class Summary:
    total: int  # non-blank input lines
    skipped: int  # already answered before this run
    succeeded: int = 0
    errors: int = 0  # error lines written this run
    not_done: int = 0  # left for a later run (the server became unreachable)
    stopped_because: str = ""
    truncated_bytes: int = 0


class ServerUnreachable(Exception):
    pass


class OutputFile:
    """Appends whole lines with one unbuffered write each, so a kill never leaves a line half
    in Python's buffer and half on disk (the kernel's page cache survives the process)."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        data = memoryview(encode(record))
        while data:
            written = os.write(self._fd, data)
            data = data[written:]

    def close(self) -> None:
        os.close(self._fd)


async def send(client: httpx.AsyncClient, request: BatchRequest, options: RunOptions) -> dict[str, Any]:
    """One request's output record; raises ServerUnreachable when no connection holds."""
    # An explicit false: some servers stream when the field is missing.
    body = {**request.body, "stream": False}
    delay_s = 0.5
    for attempt in range(options.connect_retries + 1):
        try:
            response = await client.post(request.url, json=body)
            break
        except (httpx.ReadTimeout, httpx.WriteTimeout):
            return no_response_record(request.custom_id, f"no answer within {options.timeout_s:g} s")
        except httpx.TransportError as error:
            if attempt == options.connect_retries:
                raise ServerUnreachable(f"{type(error).__name__}: {error}") from error
            await asyncio.sleep(delay_s)
            delay_s *= 2
    try:
        payload = response.json()
    except ValueError:
        payload = response.text
    if response.status_code >= 400:
        return http_error_record(request.custom_id, response.status_code, payload)
    if not isinstance(payload, dict):
        return http_error_record(
            request.custom_id, 502, f"the server's answer is not a JSON object: {payload!r:.200}"
        )
    return success_record(request.custom_id, response.status_code, payload)


def _is_error(record: dict[str, Any]) -> bool:
    return record["error"] is not None


async def run_batch(
    input_path: Path,
    output_path: Path,
    options: RunOptions,
    transport: httpx.AsyncBaseTransport | None = None,  # tests inject a fake server here
) -> Summary:
    done = load_done(output_path)
    with input_path.open(encoding="utf-8") as handle:
        work = plan(handle, done)
    summary = Summary(
        total=work.to_handle + work.skipped,
        skipped=work.skipped,
        truncated_bytes=done.truncated_bytes,
    )
    output = OutputFile(output_path)
    bar = tqdm(
        total=summary.total,
        initial=summary.skipped,
        desc="batch",
        unit="line",
        file=sys.stderr,
        disable=not options.progress,
        dynamic_ncols=True,
    )

    def finished(record: dict[str, Any]) -> None:
        output.write(record)
        if _is_error(record):
            summary.errors += 1
        else:
            summary.succeeded += 1
        bar.update()
        bar.set_postfix(errors=summary.errors, refresh=False)

    try:
        for record in work.refusals:
            finished(record)
        pending = iter(work.requests)
        limits = httpx.Limits(
            max_connections=options.concurrency, max_keepalive_connections=options.concurrency
        )
        timeout = httpx.Timeout(options.timeout_s, connect=10.0, pool=None)
        async with httpx.AsyncClient(
            base_url=options.base_url, timeout=timeout, limits=limits, transport=transport
        ) as client:

            async def worker() -> None:
                # Workers share one iterator: next() never awaits, so no line is taken twice.
                while not summary.stopped_because:
                    request = next(pending, None)
                    if request is None:
                        return
                    try:
                        record = await send(client, request, options)
                    except ServerUnreachable as error:
                        summary.stopped_because = summary.stopped_because or f"server unreachable: {error}"
                        summary.not_done += 1
                        return
                    finished(record)

            await asyncio.gather(*(worker() for _ in range(max(1, options.concurrency))))
        summary.not_done += sum(1 for _ in pending)
    finally:
        bar.close()
        output.close()
    return summary
