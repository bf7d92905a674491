"""Request bodies of the OpenAI completions and chat completions APIs, validated.

Unknown fields follow vLLM's policy (its OpenAIBaseModel): accepted, ignored, logged. The
fields of vLLM's request models Cleave does not implement are listed, with the reason, in
libs/gateway/api/vllm_fields.py, and refused (400 naming the field) when set; fields the API
has but Cleave does not implement yet are refused with a clear message in `unsupported_fields`.
Ranges are checked here, at the edge, as vLLM's OpenAI server checks them: a value that
passes is one the workers' contract can carry (seed in int64, token ids in int32) and the
engine accepts, so no client mistake ever reaches a worker as a server error.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from libs.gateway.api.request_ids import MAX_REQUEST_ID_CHARS, random_id
from libs.gateway.api.structured import ResponseFormat, StructuredOutputsIn, check_constraints
from libs.gateway.api.tools import ToolChoice, ToolParam

INT32_MAX = 2**31 - 1
# vLLM's OpenAI server accepts any seed torch's generators take: a signed 64-bit integer.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
# vLLM's bounds on `cache_salt` (validate_cache_salt): it becomes part of cache keys.
MAX_CACHE_SALT_CHARS = 128
CACHE_SALT_FORBIDDEN_CHARS = frozenset("@/\\\x00")


class _Strict(BaseModel):
    # vLLM's policy: extra fields are accepted (and ignored, with a warning: vllm_fields.py).
    model_config = ConfigDict(extra="allow")

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


class ImageUrl(_Strict):
    url: str  # data:image/...;base64,... or (where the encoder fetches them) http(s)
    detail: str | None = None  # OpenAI's; vLLM ignores it too


class ImageUrlPart(_Strict):
    type: Literal["image_url"]
    image_url: ImageUrl


class FunctionCallIn(_Strict):
    name: str
    arguments: str


class ToolCallIn(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessageIn(_Strict):
    # Any role, and any other field, goes to the chat template as vLLM's chat utils pass them
    # (a custom role such as "tool_result" is the template's to render or refuse).
    role: str
    content: str | list[TextPart | ImageUrlPart] | None = None
    name: str | None = None
    # An assistant message's calls and a `tool` message's answer, for the template.
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        # One clear refusal for audio/video parts instead of pydantic's errors about the
        # text and image parts they fail to be. Image parts are checked where the gateway
        # knows whether an encoder serves them (libs/gateway/api/images.py).
        for part in value if isinstance(value, list) else []:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind is not None and kind not in ("text", "image_url"):
                raise ValueError(
                    f"content parts of type {kind!r} are not supported; only 'text' and 'image_url' parts are"
                )
        return value

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content if isinstance(part, TextPart))

    def image_urls(self) -> list[str]:
        if not isinstance(self.content, list):
            return []
        return [part.image_url.url for part in self.content if isinstance(part, ImageUrlPart)]


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
    # vLLM's sampling extensions (its "extra params"): what the engine or the tokenizer does.
    # Bounded to the contract's int32; above max_tokens the engine refuses it (a 400).
    min_tokens: Annotated[int, Field(ge=0, le=INT32_MAX)] = 0
    stop_token_ids: list[Annotated[int, Field(ge=0, le=INT32_MAX)]] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # Keep only the prompt's last k tokens (-1: as many as the context takes), as vLLM.
    truncate_prompt_tokens: Annotated[int, Field(ge=-1, le=SEED_MAX)] | None = None
    allowed_token_ids: list[Annotated[int, Field(ge=0, le=INT32_MAX)]] | None = None
    bad_words: list[str] = Field(default_factory=list)
    prompt_logprobs: int | None = None
    # vLLM accepts it in int64 and its default FCFS scheduler ignores it; so does Cleave's FIFO.
    priority: Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX)] = 0
    # The client's id for the request (vLLM's field and default: a random id): the response's
    # id. The request's work inside runs under it plus a random suffix (request_ids.py).
    request_id: str = Field(default_factory=random_id, max_length=MAX_REQUEST_ID_CHARS)
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    # Beam search, run by the gateway as vLLM's server runs it (libs/gateway/api/beam_search.py);
    # n is the beam width. vLLM accepts early_stopping and its online beam search ignores it.
    use_beam_search: bool = False
    length_penalty: FiniteFloat = 1.0
    early_stopping: bool = False
    # Structured output (libs/gateway/api/structured.py). The legacy `functions`/`function_call`
    # are not fields of vLLM's request either: unknown fields, ignored with a warning.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsIn | None = None

    @field_validator("stream_options", mode="before")
    @classmethod
    def _only_when_streaming(cls, value: Any, info: ValidationInfo) -> Any:
        # vLLM's rule and message (validate_stream_options): options for a stream not asked for
        # are a mistake worth telling the client about (an empty object is let through).
        if value and not info.data.get("stream"):
            raise ValueError("Stream options can only be defined when `stream=True`.")
        return value

    @model_validator(mode="after")
    def _prompt_logprobs_range(self) -> _SamplingFields:
        # vLLM's checks and messages (check_logprobs).
        value = self.prompt_logprobs
        if value is not None:
            if self.stream and (value > 0 or value == -1):
                raise ValueError("`prompt_logprobs` are not available when `stream=True`.")
            if value < 0 and value != -1:
                raise ValueError("`prompt_logprobs` must be a positive value or -1.")
        # The upper bound is the workers' --max-logprobs (libs/gateway/api/logprob_limits.py).
        for name in ("logprobs", "top_logprobs"):
            count = getattr(self, name, None)
            if type(count) is int and count < 0 and count != -1:  # chat's logprobs is a bool
                raise ValueError(f"`{name}` must be a positive value or -1.")
        if any(not word for word in self.bad_words):
            raise ValueError("bad_words cannot contain an empty string.")
        return self

    @model_validator(mode="after")
    def _one_constraint(self) -> _SamplingFields:
        choice = getattr(self, "tool_choice", None)  # chat only
        check_constraints(
            self.structured_outputs, choice if choice is None or isinstance(choice, str) else "named"
        )
        return self

    @field_validator("stop")
    @classmethod
    def _non_empty_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        # How many and how long: the server's bounds (libs/gateway/api/request_limits.py).
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
        found: list[tuple[str, str]] = []
        return found


class ChatCompletionRequest(_SamplingFields):
    messages: Annotated[list[ChatMessageIn], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    # -1: the whole vocabulary (vLLM's TopLogprobsParam), as long as --max-logprobs allows.
    top_logprobs: int | None = None
    # vLLM's chat extensions: how the template renders the conversation (libs/tokenization).
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, str]] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    return_prompt_text: bool | None = None
    # Tool calling (libs/gateway/api/tools.py). tool_choice defaults to "none", or "auto" when
    # tools are given (vLLM's check_tool_usage).
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = True

    @model_validator(mode="after")
    def _tool_checks(self) -> ChatCompletionRequest:
        # vLLM's rules and messages (check_tool_usage, check_structured_outputs_count).
        if self.tools == []:
            raise ValueError(
                "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely."
            )
        if "tool_choice" not in self.model_fields_set:
            self.tool_choice = "auto" if self.tools else "none"
        choice = self.tool_choice
        if choice not in (None, "none") and self.tools is None:
            raise ValueError("When using `tool_choice`, `tools` must be set.")
        named = choice if not isinstance(choice, str) and choice is not None else None
        if named is not None and not any(
            tool.function.name == named.function.name for tool in self.tools or []
        ):
            raise ValueError(
                "The tool specified in `tool_choice` does not match any of the specified `tools`"
            )
        return self

    @model_validator(mode="after")
    def _chat_checks(self) -> ChatCompletionRequest:
        # vLLM's messages (check_generation_prompt, check_logprobs).
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("when using `top_logprobs`, `logprobs` must be set to true.")
        return self

    def template_kwargs(self) -> dict[str, Any]:
        """chat_template_kwargs with documents and reasoning_effort merged over them, as vLLM's
        build_chat_params does (add_generation_prompt and continue_final_message are the
        request's fields; the tokenizer service sets them)."""
        user = dict(self.chat_template_kwargs or {})
        for name in ("chat_template", "tokenize"):
            if name in user:  # vLLM's resolve_chat_template_kwargs refuses them too
                raise ValueError(f"Found unexpected chat template kwargs from request: {{{name!r}}}")
        for name in ("add_generation_prompt", "continue_final_message"):
            user.pop(name, None)
        if self.documents is not None:
            user["documents"] = self.documents
        if self.reasoning_effort is not None:
            user["reasoning_effort"] = self.reasoning_effort
            user.setdefault("enable_thinking", self.reasoning_effort != "none")
        return user

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: Annotated[int, Field(ge=1)] | None = 16
    logprobs: int | None = None  # -1: the whole vocabulary, as top_logprobs
    echo: bool = False
    add_special_tokens: bool = True
    suffix: str | None = None
    best_of: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _prompt_given(cls, data: Any) -> Any:
        # vLLM's validate_prompt_and_prompt_embeds, its message: a missing, null or "" prompt
        # with no (or empty) prompt_embeds. Non-empty prompt_embeds are refused later
        # (vllm_fields.REFUSED), so with a prompt they do not count as one here.
        if isinstance(data, dict):
            prompt, embeds = data.get("prompt"), data.get("prompt_embeds")
            if prompt in (None, "") and embeds in (None, []):
                raise ValueError("Either prompt or prompt_embeds must be provided and non-empty.")
        return data

    @field_validator("prompt")
    @classmethod
    def _token_ids_fit(
        cls, value: str | list[str] | list[int] | list[list[int]]
    ) -> str | list[str] | list[int] | list[list[int]]:
        # Ranges against the vocabulary are checked once it is known (libs/gateway/serving/generate.py);
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
