"""Errors in the OpenAI API's own format: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def unsupported(feature: str, param: str) -> ApiError:
    return ApiError(
        400, f"{feature} is not supported by this server yet", param=param, code="unsupported_parameter"
    )


def model_not_found(model: str, served: str) -> ApiError:
    return ApiError(
        404, f"The model '{model}' does not exist; this server serves '{served}'", type_="not_found_error",
        param="model", code="model_not_found",
    )  # fmt: skip


def context_too_long(prompt_tokens: int, max_tokens: int, max_model_len: int) -> ApiError:
    return ApiError(
        400,
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} for the completion). "
        "Please reduce the prompt or the completion length.",
        param="messages",
        code="context_length_exceeded",
    )


def no_workers(role: str) -> ApiError:
    return ApiError(
        503,
        f"no healthy {role} worker is available; retry later",
        type_="service_unavailable",
        code="no_healthy_workers",
    )


def overloaded() -> ApiError:
    return ApiError(429, "the server is overloaded; retry later", type_="rate_limit_error", code="overloaded")


def tokenizer_unavailable(detail: str) -> ApiError:
    """The tokenizer service failed: its fault alone, never a worker's."""
    return ApiError(
        503, f"tokenizer unavailable: {detail}", type_="service_unavailable", code="tokenizer_unavailable"
    )
