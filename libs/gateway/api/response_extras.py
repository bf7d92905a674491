"""vLLM's additions to the OpenAI response objects: prompt logprobs, token ids, tokens shown
as `token_id:<id>`, and what chat's `echo` / `add_generation_prompt` change in the message.
Shapes as vLLM's protocol models serialize them (CompletionResponseChoice,
ChatCompletionResponse, ChatCompletionResponseChoice)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cleave.common.v1 import common_pb2

TokenText = Callable[[Sequence[int]], Awaitable[dict[int, str]]]


async def token_id_labels(ids: Sequence[int]) -> dict[int, str]:
    """vLLM's return_tokens_as_token_ids: each token shown as `token_id:<id>` (a TokenText)."""
    return {token_id: f"token_id:{token_id}" for token_id in ids}


def _clamped(logprob: float) -> float:
    return max(logprob, -9999.0)  # -inf is not JSON; vLLM's clamp_prompt_logprobs


async def prompt_logprobs(
    prompt: Sequence[int], entries: Sequence[common_pb2.TokenLogprob], token_text: TokenText
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's `prompt_logprobs`: None for the first prompt token, then for each position the
    prompt's token and the top alternatives as {id: {logprob, rank, decoded_token}}."""
    ids = set(prompt) | {t.token_id for e in entries for t in e.top}
    texts = await token_text(sorted(ids))
    result: list[dict[str, dict[str, Any]] | None] = []
    for position, token_id in enumerate(prompt):
        if position == 0 or position >= len(entries):
            result.append(None)
            continue
        entry = entries[position]

        def item(tid: int, logprob: float, rank: int) -> dict[str, Any]:
            return {"logprob": _clamped(logprob), "rank": rank, "decoded_token": texts.get(tid, "")}

        step = {str(token_id): item(token_id, entry.logprob, entry.rank)}
        for top in sorted(entry.top, key=lambda t: t.rank):
            step.setdefault(str(top.token_id), item(top.token_id, top.logprob, top.rank))
        result.append(step)
    return result


def echo_entries(
    prompt: Sequence[int], prompt_entries: Sequence[common_pb2.TokenLogprob]
) -> list[common_pb2.TokenLogprob | int]:
    """The prompt's logprob entries for completions' echo: the first token (which has none)
    as its bare id, as vLLM shows it (token text, null logprob, null top_logprobs)."""
    out: list[common_pb2.TokenLogprob | int] = []
    for position, token_id in enumerate(prompt):
        if position == 0 or position >= len(prompt_entries):
            out.append(token_id)
        else:
            out.append(prompt_entries[position])
    return out


@dataclass(frozen=True)
class ChatExtras:
    """What a chat request's vLLM options add to its response."""

    return_token_ids: bool = False
    # add_generation_prompt false: the reply continues the last message, in its role.
    role: str = "assistant"
    # echo: the last message's content, when it has the reply's role, starts the reply.
    echo_text: str = ""
    prompt_text: str | None = None  # return_prompt_text: the rendered prompt
    prompt_token_ids: tuple[int, ...] = ()

    def message(self, message: dict[str, Any]) -> dict[str, Any]:
        message = {**message, "role": self.role}
        if self.echo_text:
            message["content"] = self.echo_text + (message.get("content") or "")
        return message

    def top_level(self) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        if self.return_token_ids:
            fields["prompt_token_ids"] = list(self.prompt_token_ids)
        if self.prompt_text is not None:
            fields["prompt_text"] = self.prompt_text
        return fields


def chat_extras(body: Any, prompt_token_ids: Sequence[int], prompt_text: str) -> ChatExtras:
    """From a ChatCompletionRequest: the reply's role and echo as vLLM's serving computes them."""
    last = body.messages[-1]
    role = "assistant" if body.add_generation_prompt else last.role
    echo_text = last.text() if body.echo and last.role == role else ""
    return ChatExtras(
        return_token_ids=bool(body.return_token_ids),
        role=role,
        echo_text=echo_text,
        prompt_text=prompt_text if body.return_prompt_text else None,
        prompt_token_ids=tuple(prompt_token_ids),
    )
