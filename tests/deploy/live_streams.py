"""Streamed chat completions against a live stack's gateway, as a client reads them, and the
drain check the scale check ends with (compose_live_checks.py). Standard library only."""

from __future__ import annotations

import argparse
import json
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tests.deploy.live_stack import CheckFailed, Stack, log

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how rainbows form.",
    "Describe a walk through a forest in autumn.",
    "What should a beginner know about baking bread?",
]
# Structured output: the gateway cannot migrate such a stream, so a drain must let it finish.
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city", "country"],
}


@dataclass
class Stream:
    """One streamed chat completion as the client saw it."""

    text: str = ""
    tokens: int = 0
    finish_reason: str | None = None
    errors: list[Any] = field(default_factory=list)
    status: int | None = None
    done: bool = False
    started: float = field(default_factory=time.monotonic)
    first_token_s: float | None = None
    structured: bool = False  # a json_schema stream

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.done and not self.errors and self.finish_reason is not None


def body(model: str, index: int, *, structured: bool, max_tokens: int) -> dict[str, Any]:
    chat: dict[str, Any] = {
        "model": model,
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "messages": [{"role": "user", "content": PROMPTS[index % len(PROMPTS)]}],
    }
    if structured:
        chat["messages"] = [{"role": "user", "content": "Name a city and its country as JSON."}]
        chat["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "city", "schema": CITY_SCHEMA},
        }
    else:
        chat["ignore_eos"] = True  # every text stream runs its whole length
    return chat


def stream_chat(base: str, request: dict[str, Any], seen: Stream, timeout: float = 300) -> Stream:
    http = urllib.request.Request(
        base + "/v1/chat/completions",
        data=json.dumps(request).encode(),
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(http, timeout=timeout) as response:
            seen.status = response.status
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    seen.done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    seen.errors.append(event["error"])
                    continue
                for choice in event.get("choices", []):
                    content = choice["delta"].get("content") or ""
                    if content:
                        seen.first_token_s = seen.first_token_s or time.monotonic() - seen.started
                        seen.tokens += 1
                    seen.text += content
                    seen.finish_reason = choice.get("finish_reason") or seen.finish_reason
    except urllib.error.HTTPError as error:
        seen.status = error.code
        seen.errors.append(error.read().decode(errors="replace")[:300])
    except OSError as error:  # a reset connection, a timeout
        seen.errors.append(repr(error))
    return seen


def start_streams(
    pool: ThreadPoolExecutor, base: str, model: str, count: int, *, max_tokens: int, structured_every: int = 2
) -> list[tuple[Stream, Future[Stream]]]:
    """`count` streams at once, their kinds in pairs: with `structured_every` 2, two text
    streams, two json_schema ones, two text... (0: text only). Least-load routing alternates
    between two idle workers, so with single alternation one worker got every text stream and
    the other only json_schema ones, which close early: a CI run's drain check found no
    stream left on the worker it stopped."""
    started = []
    for i in range(count):
        seen = Stream(structured=structured_every > 0 and (i // 2) % structured_every == 1)
        request = body(model, i, structured=seen.structured, max_tokens=max_tokens)
        started.append((seen, pool.submit(stream_chat, base, request, seen)))
    return started


def drain_streams_check(stack: Stack, args: argparse.Namespace, leaving: str) -> None:
    """8 streams (4 text, 4 json_schema) over the two decode workers; the one in `leaving` is
    stopped as compose's scale-down stops it (SIGTERM, its stop grace) once every stream has
    tokens. Every stream must complete without an error; the worker must exit 0 in its grace."""
    model = stack.get_json("/v1/models")["data"][0]["id"]
    grace = 60.0
    with ThreadPoolExecutor(8) as pool:
        # Long enough that text streams still run once the last of the 8 has started (the one
        # prefill worker takes them in turn): at 48 tokens a run found 1 of 8 left to drain.
        streams = start_streams(pool, stack.base, model, 8, max_tokens=160)
        deadline = time.monotonic() + args.request_timeout
        while min(s.tokens for s, _ in streams) < 3:
            if time.monotonic() > deadline:
                raise CheckFailed(f"streams did not start: {[s.tokens for s, _ in streams]}")
            time.sleep(0.1)
        address = stack.inspect(leaving, "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}")
        polls_until = time.monotonic() + 3  # the gateway polls each worker's stats every second
        while True:
            running = {w["address"]: w["running"] for w in stack.decode_workers()}
            on_leaving = sum(n for a, n in running.items() if a.split(":")[0] == address)
            if on_leaving or time.monotonic() > polls_until:
                break
            time.sleep(0.3)
        log(f"drain: streams running per decode worker (the gateway's last poll): {running}")
        if not on_leaving:
            raise CheckFailed(f"drain: no stream runs on the worker to stop ({address}): {running}")
        stopped = time.monotonic()
        stack.docker("stop", "--time", str(int(grace)), leaving, timeout=grace + 30)
        took = time.monotonic() - stopped
        for _, future in streams:
            future.result(timeout=args.request_timeout)
    exit_code = int(stack.inspect(leaving, "{{.State.ExitCode}}"))
    bad = [(s.status, s.errors, s.finish_reason) for s, _ in streams if not s.ok]
    if bad:
        raise CheckFailed(f"drain: {len(bad)} of 8 streams failed while a decode worker drained: {bad}")
    for seen, _ in streams:
        if seen.structured:
            json.loads(seen.text)  # the json_schema streams finished whole
    if exit_code != 0 or took > grace:
        raise CheckFailed(
            f"drain: the stopped worker exited {exit_code} after {took:.1f}s (grace {grace:.0f}s)"
        )
    log(
        f"drain: SIGTERM to a decode worker with {on_leaving} of 8 streams on it: all 8 completed "
        f"(4 text, 4 json_schema), 0 errors; it exited 0 after {took:.1f}s"
    )
