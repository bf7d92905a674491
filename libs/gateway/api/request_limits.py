"""Bounds on what one request may ask for, checked before any service spends work on it.

Each bound is a 400 naming the field, answered before the prompt goes to the tokenizer:
prompt text (characters), stop strings (matched on every generated token by the shared
tokenizer service), and sequences per request (prompts x n, each one a generation on a
worker). Generated tokens are bounded in libs/gateway/api/spec.py: never past the context.
"""

from __future__ import annotations

from dataclasses import dataclass

from libs.gateway.api.openai_api import (
    ChatCompletionRequest,
    CompletionRequest,
    TokenizeRequest,
    _SamplingFields,
)
from libs.gateway.common import errors

# Without --max-prompt-chars: this many characters per token of context. Tokens average
# about 4 characters of English; 32 leaves room for any text that can still fit the context
# while refusing a megabyte pasted at a model of a few thousand tokens.
CHARS_PER_CONTEXT_TOKEN = 32
# OpenAI's API allows 4 stop strings, vLLM any number: generous, but bounded.
DEFAULT_MAX_STOP_STRINGS = 64
DEFAULT_MAX_STOP_STRING_CHARS = 1024
DEFAULT_MAX_SEQUENCES = 128


@dataclass(frozen=True)
class RequestLimits:
    max_prompt_chars: int = 0  # 0: CHARS_PER_CONTEXT_TOKEN x the context length
    max_stop_strings: int = DEFAULT_MAX_STOP_STRINGS
    max_stop_string_chars: int = DEFAULT_MAX_STOP_STRING_CHARS
    max_sequences: int = DEFAULT_MAX_SEQUENCES
    max_tokens_cap: int | None = None  # None: only the context bounds a completion

    def prompt_chars(self, max_model_len: int) -> int:
        return self.max_prompt_chars or CHARS_PER_CONTEXT_TOKEN * max_model_len

    def check(self, body: _SamplingFields, max_model_len: int) -> None:
        if isinstance(body, ChatCompletionRequest):
            self.check_chars(sum(len(m.text()) for m in body.messages), max_model_len, "messages")
            prompts = 1
        elif isinstance(body, CompletionRequest):
            self.check_chars(_completion_chars(body), max_model_len, "prompt")
            prompts = _prompt_count(body)
        else:
            prompts = 1
        self._check_stops(body.stops())
        self.check_sequences(prompts, body.n, "n")

    def check_sequences(self, prompts: int, n: int, param: str, *, what: str = "prompt(s)") -> None:
        """prompts x n sequences (each a generation on a worker) against --max-sequences-per-request."""
        if prompts * n > self.max_sequences:
            raise errors.invalid(
                f"{prompts} {what} x n={n} is {prompts * n} sequences; "
                f"this server generates at most {self.max_sequences} per request",
                param,
            )

    def check_tokenize(self, body: TokenizeRequest, max_model_len: int) -> None:
        chars = len(body.prompt or "") + sum(len(m.text()) for m in body.messages or [])
        self.check_chars(chars, max_model_len, "messages" if body.messages else "prompt")

    def check_chars(self, chars: int, max_model_len: int, param: str) -> None:
        limit = self.prompt_chars(max_model_len)
        if chars > limit:
            raise errors.invalid(
                f"the prompt has {chars} characters; this server accepts at most {limit} "
                "(far more than the context holds) before tokenizing",
                param,
            )

    def _check_stops(self, stops: list[str]) -> None:
        if len(stops) > self.max_stop_strings:
            raise errors.invalid(f"at most {self.max_stop_strings} stop strings, got {len(stops)}", "stop")
        for stop in stops:
            if len(stop) > self.max_stop_string_chars:
                raise errors.invalid(
                    f"a stop string has at most {self.max_stop_string_chars} characters, got {len(stop)}",
                    "stop",
                )


def _completion_chars(body: CompletionRequest) -> int:
    prompt = body.prompt
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(item) for item in prompt if isinstance(item, str))


def _prompt_count(body: CompletionRequest) -> int:
    prompt = body.prompt
    if isinstance(prompt, str) or all(isinstance(p, int) for p in prompt):
        return 1
    return len(prompt)
