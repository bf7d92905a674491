"""A request body that fails validation, answered as vLLM's OpenAI server answers it.

vLLM (vllm/entrypoints/serve/exception_handling/handlers/validation.py, 0.32.0) reports a
RequestValidationError as a 400 whose message is "N validation error(s):" followed by each
error as pydantic gives it (type, loc, msg, input, ctx), the echoed input and the count
bounded, the location cleaned of pydantic's internal markers, and whose param is the first
error's location; type "Bad Request", code 400. Clients and vLLM's own tests read the
pydantic error type from the message (e.g. 'greater_than_equal' for an out-of-range seed).

The gateway does not import vLLM (that pulls in torch: ~14 s and ~3,000 modules), so these
few lines are mirrored here; tests/libs/gateway/test_validation_errors.py pins them to
vLLM's own handler.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from libs.gateway.common import errors

# pydantic-core's wrapper and union-branch names that can appear in an error's loc.
_INTERNAL_LOC_MARKERS = frozenset(
    {
        "function-wrap", "function-after", "function-before", "function-plain", "json-or-python",
        "lax-or-strict", "chain", "default", "nullable", "tagged-union", "union", "call",
        "arguments", "is-instance", "is-subclass", "callable", "str", "int", "float", "bool",
        "bytes", "bytearray", "list", "tuple", "dict", "set", "frozenset", "complex", "none",
        "nonetype",
    }
)  # fmt: skip
_BRACKETED_INTERNAL = re.compile(r"[\[\]{}()]")
# One malformed body can fail per element; pydantic echoes the input in every error.
_MAX_REPORTED_ERRORS = 10
_MAX_ERROR_INPUT_CHARS = 200
_MAX_ERROR_CHARS = 1000


def validation_failed(details: Sequence[Mapping[str, Any]]) -> errors.ApiError:
    """The 400 for a body that failed validation; `details` as RequestValidationError.errors()."""
    first_loc = details[0].get("loc") if details else None
    param = clean_loc(tuple(first_loc)) if first_loc else None
    if details:
        label = "error" if len(details) == 1 else "errors"
        reported = details[:_MAX_REPORTED_ERRORS]
        message = f"{len(details)} validation {label}:\n"
        message += "".join(f"  {_format_error(detail)}\n" for detail in reported)
        if len(details) > len(reported):
            message += f"  ...and {len(details) - len(reported)} more {label}\n"
        message = message.rstrip()
    else:
        message = "Validation error"
    status = HTTPStatus.BAD_REQUEST
    return errors.ApiError(status, _sanitize(message), type_=status.phrase, param=param, code=status.value)


def clean_loc(loc: tuple[Any, ...]) -> str:
    """A loc as a dotted path without pydantic's internal markers: ('body', 'seed') -> 'body.seed'."""
    parts = [str(p) for p in loc if not _is_internal(str(p))]
    return ".".join(parts) if parts else ".".join(str(p) for p in loc)


def _is_internal(segment: str) -> bool:
    return bool(_BRACKETED_INTERNAL.search(segment)) or segment.lower() in _INTERNAL_LOC_MARKERS


def _format_error(detail: Mapping[str, Any]) -> str:
    # FastAPI reports errors without pydantic's documentation url; a pydantic ValidationError's
    # own errors() (the batched chat endpoint validates each conversation itself) carry one.
    error = {key: value for key, value in detail.items() if key != "url"}
    if "input" in error:
        error["input"] = _summarize_input(error["input"])
    if isinstance(error.get("loc"), (tuple, list)):
        error["loc"] = clean_loc(tuple(error["loc"]))
    return _cut(str(error), _MAX_ERROR_CHARS)


def _summarize_input(value: object) -> object:
    if isinstance(value, str):
        return _cut(value, _MAX_ERROR_INPUT_CHARS)
    if isinstance(value, (bytes, bytearray)):
        return f"<{type(value).__name__} of {len(value)} bytes>"
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    try:
        text = str(value)
    except Exception:  # e.g. an int past sys.get_int_max_str_digits()
        return f"<{type(value).__name__}>"
    return _cut(text, _MAX_ERROR_INPUT_CHARS)


def _cut(text: str, limit: int) -> str:
    return text[:limit] + "...[truncated]" if len(text) > limit else text


def _sanitize(message: str) -> str:
    """No memory addresses, traceback lines or file paths in what a client reads."""
    message = re.sub(r" at 0x[0-9a-fA-F]+>", ">", message)
    message = re.sub(r'\n?\s*File "[^"]+", line \d+, in \S+(\n\s+.*)?', "", message)
    message = re.sub(r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[\w.\-]+)+", "<path>", message)
    message = re.sub(r"(?:/[\w\-]+)+/[\w\-]+\.\w+", "<path>", message)
    return message.strip()
