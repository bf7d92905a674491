"""Pipeline events -> OpenAI response objects (whole and streamed chunks)."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cleave.common.v1 import common_pb2

TokenText = Callable[[Sequence[int]], Awaitable[dict[int, str]]]


@dataclass
class Choice:
    text: str = ""
    finish_reason: str | None = None
    logprobs: list[common_pb2.TokenLogprob] = field(default_factory=list)


def usage(prompt_tokens: int, completion_tokens: int, cached: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached:
        body["prompt_tokens_details"] = {"cached_tokens": cached}
    return body


async def chat_logprobs(
    entries: Sequence[common_pb2.TokenLogprob], top: int, token_text: TokenText
) -> dict[str, Any]:
    ids = {e.token_id for e in entries} | {t.token_id for e in entries for t in e.top}
    texts = await token_text(sorted(ids))

    def item(token_id: int, logprob: float) -> dict[str, Any]:
        text = texts.get(token_id, "")
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    content = []
    for entry in entries:
        alternatives = sorted(entry.top, key=lambda t: t.rank)[:top]
        content.append(
            {
                **item(entry.token_id, entry.logprob),
                "top_logprobs": [item(t.token_id, t.logprob) for t in alternatives],
            }
        )
    return {"content": content}


async def completion_logprobs(
    entries: Sequence[common_pb2.TokenLogprob], top: int, token_text: TokenText
) -> dict[str, Any]:
    ids = {e.token_id for e in entries} | {t.token_id for e in entries for t in e.top}
    texts = await token_text(sorted(ids))
    tokens = [texts.get(e.token_id, "") for e in entries]
    offsets, position = [], 0
    for token in tokens:
        offsets.append(position)
        position += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [
            {texts.get(t.token_id, ""): t.logprob for t in sorted(e.top, key=lambda t: t.rank)[:top]}
            for e in entries
        ],
        "text_offset": offsets,
    }


def sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


def now() -> int:
    return int(time.time())
