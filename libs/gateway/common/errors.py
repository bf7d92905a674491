"""Errors in the OpenAI API's own format: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from libs.config.roles import Role


class MidStreamError(Exception):
    """A request failed after its client got tokens: the stream ends with an error event (the
    HTTP status is already sent), not a hang."""


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        # HTTP headers the response must carry (Retry-After on a 429).
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def framework_error(status: int, detail: str) -> ApiError:
    """An HTTP error raised by the web framework itself (a body it cannot parse, an unknown
    path or method), shaped as vLLM's server shapes them: the status's phrase as the type and
    the status as the code."""
    return ApiError(status, detail, type_=HTTPStatus(status).phrase, code=status)


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


def no_workers(role: Role) -> ApiError:
    return ApiError(
        503,
        f"no healthy {role} worker is available; retry later",
        type_="service_unavailable",
        code="no_healthy_workers",
    )


def overloaded() -> ApiError:
    return ApiError(429, "the server is overloaded; retry later", type_="rate_limit_error", code="overloaded")


def queue_full(max_queued: int, retry_after_s: int) -> ApiError:
    """Every worker is at its in-flight bound and the gateway's queue is full."""
    return _rate_limited(
        f"the server is at capacity: {max_queued} requests are already waiting for a worker; "
        f"retry after {retry_after_s} s",
        retry_after_s,
    )


def queue_timeout(waited_s: float, retry_after_s: int) -> ApiError:
    """A queued request found no free worker within --queue-timeout."""
    return _rate_limited(
        f"the server is at capacity: no worker was free within {waited_s:g} s; retry after {retry_after_s} s",
        retry_after_s,
    )


def _rate_limited(message: str, retry_after_s: int) -> ApiError:
    # OpenAI's own 429s carry code "rate_limit_exceeded"; Retry-After is what its SDKs (and
    # most HTTP clients) wait before retrying.
    return ApiError(
        429, message, type_="rate_limit_error", code="rate_limit_exceeded",
        headers={"Retry-After": str(retry_after_s)},
    )  # fmt: skip


def request_timeout(budget_s: float | None) -> ApiError:
    """The request's deadline (--request-timeout) passed: 504, as a proxy whose upstream did
    not answer in time (vLLM's server has no request deadline of its own)."""
    budget = f"its {budget_s:g} s deadline" if budget_s else "its deadline"
    return ApiError(
        504,
        f"the request did not complete within {budget} (--request-timeout)",
        type_="timeout",
        code="request_timeout",
    )


def tokenizer_unavailable(detail: str) -> ApiError:
    """The tokenizer service failed: its fault alone, never a worker's."""
    return ApiError(
        503, f"tokenizer unavailable: {detail}", type_="service_unavailable", code="tokenizer_unavailable"
    )
