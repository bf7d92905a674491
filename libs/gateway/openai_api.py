"""Request bodies of the OpenAI completions and chat completions APIs, validated.

Unknown fields are refused (extra="forbid") rather than silently ignored; fields the API
has but Cleave does not implement yet are refused with a clear message in `unsupported_fields`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessageIn(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Strict):
    include_usage: bool = False
    # vLLM's extension (GuideLLM sends it): usage so far on every chunk.
    continuous_usage_stats: bool = False


class _SamplingFields(_Strict):
    model: str
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: int | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: Annotated[int, Field(ge=1, le=16)] = 1
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] = 0.0
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] = 0.0
    repetition_penalty: Annotated[float, Field(gt=0)] | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    ignore_eos: bool = False
    # Fields of the API that are refused until implemented (see unsupported_fields).
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def unsupported_fields(self) -> list[tuple[str, str]]:
        found = []
        if self.tools or self.functions:
            found.append(("tool calling", "tools"))
        if self.tool_choice not in (None, "none"):
            found.append(("tool_choice", "tool_choice"))
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            found.append(("response_format other than text", "response_format"))
        return found


class ChatCompletionRequest(_SamplingFields):
    messages: Annotated[list[ChatMessageIn], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: Annotated[int, Field(ge=1)] | None = 16
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def unsupported_fields(self) -> list[tuple[str, str]]:
        found = super().unsupported_fields()
        if self.suffix:
            found.append(("suffix (insertion)", "suffix"))
        if self.best_of not in (None, 1):
            found.append(("best_of > 1", "best_of"))
        return found


class TokenizeRequest(_Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessageIn] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int]
