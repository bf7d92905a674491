"""How a server that is shutting down says so to its callers.

A draining server answers health NOT_SERVING and refuses new work with UNAVAILABLE whose
details start with `PREFIX`. A caller that sees it knows the call never started (nothing was
computed, nothing streamed), so sending the same call to another server is safe; a plain
UNAVAILABLE (a dropped connection, a crash) says nothing of the kind.
"""

from __future__ import annotations

PREFIX = "draining:"


def message(reason: str) -> str:
    """The details of a draining server's refusal."""
    return f"{PREFIX} {reason}"


def is_draining(details: str | None) -> bool:
    return bool(details) and str(details).startswith(PREFIX)
