"""A request's life in the serving room, as explicit state: where it is, where it may go next,
and what leaving a state must undo.

    PLANNED ─┬─► PREFILLING ─┬─► HANDED_OFF ──► DECODING ──► STREAMING ──► DONE
             │     ▲    │    │      │    ▲          │  ▲        │  ▲
             │     └────┘    │      │    │          │  └─ DONE  ▼  │
             │     retry     │      │    └ rejected │        MIGRATING
             │               └──────┼──► DECODING   │
             └─────────────────────────► DECODING   │
    HANDED_OFF, DECODING ──► MIGRATING ──► DECODING  (the worker failed before any token)
    every phase but DONE ──────────────────────────────────────► FAILED

- PLANNED: admitted to a decode (or colocated) worker; its route is chosen next (route.py).
- PREFILLING: a prefill worker computes the prompt's KV; a worker's own failure retries on
  another (PREFILLING again). A prefill that ends the request at once (EOS first) leaves no KV:
  DECODING follows, and the decode worker computes the prompt.
- HANDED_OFF: the prefill worker holds the prompt's KV under a lease for a decode worker that
  has not answered yet. Leaving it for anything but DECODING releases that KV (the machine's
  one effect): a handoff the decode worker rejected is prefilled again (PREFILLING; at most
  twice), anything else fails the request.
- DECODING: a worker has the request (the handoff consumed, or the prompt computed there) and
  no token has reached the client. The worker's own failure now (its process or connection
  gone, its engine stopped) moves the request to another worker (MIGRATING, then DECODING
  there: nothing was sent, so nothing constrains the new run); any other failure is an HTTP
  error. From HANDED_OFF the same: the handoff's KV is released and the new worker computes
  the prompt.
- STREAMING: tokens were sent. The worker's own failure now moves the request (MIGRATING);
  any other failure ends the stream with an error event.
- MIGRATING: the tokens generated so far go to another decode worker as a longer prompt
  (migration.py); STREAMING goes on there (DECODING when no token was sent yet), or the
  request fails when it cannot move.
- DONE / FAILED: the end. FAILED carries why; a client that went away fails the request too
  (its worker calls are cancelled, which frees their KV).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable

import structlog

from libs.gateway.common import metrics

log = structlog.get_logger(__name__)


class Phase(enum.Enum):
    PLANNED = "planned"
    PREFILLING = "prefilling"
    HANDED_OFF = "handed_off"
    DECODING = "decoding"
    STREAMING = "streaming"
    MIGRATING = "migrating"
    DONE = "done"
    FAILED = "failed"


TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.PLANNED: frozenset({Phase.PREFILLING, Phase.DECODING, Phase.FAILED}),
    Phase.PREFILLING: frozenset({Phase.PREFILLING, Phase.HANDED_OFF, Phase.DECODING, Phase.FAILED}),
    Phase.HANDED_OFF: frozenset({Phase.DECODING, Phase.PREFILLING, Phase.MIGRATING, Phase.FAILED}),
    Phase.DECODING: frozenset({Phase.STREAMING, Phase.MIGRATING, Phase.DONE, Phase.FAILED}),
    Phase.STREAMING: frozenset({Phase.MIGRATING, Phase.DONE, Phase.FAILED}),
    Phase.MIGRATING: frozenset({Phase.STREAMING, Phase.DECODING, Phase.FAILED}),
    Phase.DONE: frozenset(),
    Phase.FAILED: frozenset(),
}
TERMINAL = frozenset({Phase.DONE, Phase.FAILED})
# Phases in which the client already has tokens: a failure is an error event, not a status.
_TOKENS_SENT = frozenset({Phase.STREAMING, Phase.MIGRATING})

# Frees the KV a prefill worker holds for this request's handoff (through a decode worker).
ReleaseKv = Callable[[], Awaitable[None]]


class IllegalTransition(RuntimeError):
    """A bug in the serving code: a request moved where its life does not go."""


class RequestLife:
    """One request's phase, the path it took, and the handoff KV it holds while HANDED_OFF."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.phase = Phase.PLANNED
        self.path: list[Phase] = [Phase.PLANNED]
        self.why = ""  # why it entered its phase (a failure's description, a rejection's reason)
        self._release: ReleaseKv | None = None

    @property
    def sent_tokens(self) -> bool:
        return self.phase in _TOKENS_SENT

    async def to(self, phase: Phase, *, release: ReleaseKv | None = None, why: str = "") -> None:
        """Moves to `phase`, running the effect of leaving the current one. `release` is how to
        free the handoff's KV, given when entering HANDED_OFF."""
        if phase not in TRANSITIONS[self.phase]:
            raise IllegalTransition(f"request {self.request_id}: {self.phase.value} -> {phase.value}")
        if phase is Phase.HANDED_OFF and release is None:
            raise IllegalTransition(f"request {self.request_id}: a handoff without a way to release it")
        leaving, self.phase, self.why = self.phase, phase, why
        self.path.append(phase)
        metrics.REQUEST_PHASES.labels(phase.value).inc()
        log.debug("request phase", request_id=self.request_id, phase=phase.value, why=why or None)
        if leaving is Phase.HANDED_OFF and phase is not Phase.DECODING:
            await self._release_handoff()
        if phase is Phase.HANDED_OFF:
            self._release = release
        elif phase is Phase.DECODING:
            self._release = None  # the decode worker consumed the KV

    def handoff_rejected(self, reason: str) -> None:
        """The decode worker refused the handoff's KV before answering: the request stays
        HANDED_OFF (the KV still leased) for its caller to prefill again or give up."""
        if self.phase is not Phase.HANDED_OFF:
            raise IllegalTransition(f"request {self.request_id}: a handoff rejected in {self.phase.value}")
        self.why = reason

    async def fail(self, why: str) -> None:
        """Ends the request as FAILED from whatever phase it is in (unless it already ended)."""
        if self.phase not in TERMINAL:
            await self.to(Phase.FAILED, why=why)

    async def _release_handoff(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            # Shielded: a client going away cancels the request's task, and the prefill
            # worker's KV must be freed all the same.
            await asyncio.shield(release())
