"""structlog set up once per process; request ids bound through contextvars.

Every log line emitted while a request is being served carries its `request_id`: the gRPC
server interceptor binds it (from the `x-request-id` metadata) for the handler's task, and
the client interceptor forwards it on outgoing calls.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import structlog

REQUEST_ID_KEY = "request_id"


def configure_logging(*, level: str = "info", json: bool = False, service: str = "") -> None:
    """Call once, from a process's entry point. Also routes stdlib logging (vLLM, grpc)."""
    numeric_level = logging.getLevelNamesMapping().get(level.upper())
    if numeric_level is None:
        raise ValueError(f"unknown log level {level!r}; expected debug, info, warning or error")
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if service:
        shared.insert(0, _add_service(service))
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric_level)


def _add_service(service: str) -> structlog.typing.Processor:
    def add(_logger: object, _method: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
        event.setdefault("service", service)
        return event

    return add


def current_request_id() -> str | None:
    value = structlog.contextvars.get_contextvars().get(REQUEST_ID_KEY)
    return str(value) if value is not None else None


def bind_request_id(request_id: str) -> None:
    """Binds the request id in the current context (a gRPC handler's own task) for good."""
    structlog.contextvars.bind_contextvars(**{REQUEST_ID_KEY: request_id})


@contextmanager
def bound_request_id(request_id: str) -> Iterator[None]:
    """Binds the request id for log lines (and outgoing gRPC calls) inside the block."""
    with structlog.contextvars.bound_contextvars(**{REQUEST_ID_KEY: request_id}):
        yield
