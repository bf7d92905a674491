"""Request bodies of the OpenAI completions and chat completions APIs, validated.

Unknown fields are refused (extra="forbid") rather than silently ignored; fields the API
has but Cleave does not implement yet are refused with a clear message in `unsupported_fields`.
Ranges are checked here, at the edge, as vLLM's OpenAI server checks them: a value that
passes is one the workers' contract can carry (seed in int64, token ids in int32) and the
engine accepts, so no client mistake ever reaches a worker as a server error.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

INT32_MAX = 2**31 - 1
# vLLM's OpenAI server accepts any seed torch's generators take: a signed 64-bit integer.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
# vLLM's bounds on `cache_salt` (validate_cache_salt): it becomes part of cache keys.
MAX_CACHE_SALT_CHARS = 128
CACHE_SALT_FORBIDDEN_CHARS = frozenset("@/\\\x00")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _utf8_strings(cls, data: Any) -> Any:
        # JSON's "\ud800" escape decodes to a lone surrogate, which no UTF-8 encoder (protobuf's
        # included) accepts: refused here, or the first gRPC call would fail as a 500.
        _check_utf8(data)
        return data


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
    # -1 and 0 both mean "disabled", as in vLLM.
    top_k: Annotated[int, Field(ge=-1, le=INT32_MAX)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    seed: Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX)] | None = None
    stop: str | list[str] | None = None
    n: Annotated[int, Field(ge=1, le=16)] = 1
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] = 0.0
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] = 0.0
    repetition_penalty: Annotated[FiniteFloat, Field(gt=0)] | None = None
    # Token id (as a string, as in OpenAI's API) -> bias; vLLM clamps biases to [-100, 100].
    # Keys are checked as token ids when mapped (requests.py) and against the vocabulary
    # once it is known (pipeline.py).
    logit_bias: dict[str, FiniteFloat] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    ignore_eos: bool = False
    # vLLM's prefix-cache salt: KV computed for this request is reused only by requests with
    # the same salt (engine prefix caches and the kvstore), so other tenants cannot learn
    # from cache hits which prompts were sent. Should be random and secret per tenant.
    cache_salt: str | None = None
    # Fields of the API that are refused until implemented (see unsupported_fields).
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    @field_validator("stream_options", mode="before")
    @classmethod
    def _only_when_streaming(cls, value: Any, info: ValidationInfo) -> Any:
        # vLLM's rule and message (validate_stream_options): options for a stream not asked for
        # are a mistake worth telling the client about (an empty object is let through).
        if value and not info.data.get("stream"):
            raise ValueError("Stream options can only be defined when `stream=True`.")
        return value

    @field_validator("stop")
    @classmethod
    def _non_empty_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        # How many and how long: the server's bounds (libs/gateway/request_limits.py).
        stops = [value] if isinstance(value, str) else value or []
        if any(not stop for stop in stops):
            raise ValueError("stop strings must not be empty")
        return value

    @field_validator("cache_salt")
    @classmethod
    def _valid_cache_salt(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value:
            raise ValueError("cache_salt must be a non-empty string if provided")
        if len(value) > MAX_CACHE_SALT_CHARS or any(c in CACHE_SALT_FORBIDDEN_CHARS for c in value):
            raise ValueError(
                f"cache_salt must be at most {MAX_CACHE_SALT_CHARS} characters and must not contain "
                "'@', '/', '\\', or NUL"
            )
        return value

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

    @field_validator("prompt")
    @classmethod
    def _token_ids_fit(
        cls, value: str | list[str] | list[int] | list[list[int]]
    ) -> str | list[str] | list[int] | list[list[int]]:
        # Ranges against the vocabulary are checked once it is known (libs/gateway/pipeline.py);
        # this keeps ids inside what the contract's int32 fields carry.
        for item in value if isinstance(value, list) else []:
            for token_id in item if isinstance(item, list) else [item]:
                if isinstance(token_id, int) and not 0 <= token_id <= INT32_MAX:
                    raise ValueError(f"token ids are 0 or more and below 2**31, got {token_id}")
        return value

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
    # At least one, as for a chat completion (tokenize_api renders them as one): [] was a 500.
    messages: Annotated[list[ChatMessageIn], Field(min_length=1)] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(_Strict):
    model: str | None = None
    # Bounded to what the contract's int32 ids carry (beyond: a protobuf error, a 500).
    tokens: list[Annotated[int, Field(ge=0, le=INT32_MAX)]]


def _check_utf8(data: Any) -> None:
    pending = [data]  # a loop, not recursion: bodies may nest deeply
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as error:
                raise ValueError(
                    f"text must be valid Unicode; found a lone surrogate at {error.start}"
                ) from None
        elif isinstance(value, dict):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
