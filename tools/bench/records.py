"""What was measured for one request."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestRecord:
    request_id: int  # order in which requests started
    session_id: int
    turn: int  # 0-based turn within the session
    start_s: float  # when the request was sent, seconds after the benchmark started
    # Estimated prompt tokens: the words sent, plus, in a multiturn session, the earlier turns
    # and answers that the request resends (chat template not included).
    input_len: int
    max_tokens: int
    ok: bool
    error: str | None = None
    ttft_s: float | None = None  # until the first non-empty content chunk
    e2e_s: float | None = None
    itl_s: tuple[float, ...] = ()  # gaps between successive non-empty content chunks
    output_tokens: int = 0  # from the usage chunk, else the number of content chunks
    prompt_tokens: int | None = None  # from the usage chunk; None when the server sent none
