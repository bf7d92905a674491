"""When the local stack restarts a child that crashed: bounded exponential backoff, and at
most so many restarts in a window, after which a child that keeps crashing stays down (its
log says why; restarting it forever would only hide that)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    backoff_s: float = 1.0  # before the first restart; doubled for each recent one
    max_backoff_s: float = 30.0
    max_restarts: int = 5  # in any `window_s`; 0 = never restart
    window_s: float = 600.0

    def delay(self, restarts: Sequence[float], now: float) -> float | None:
        """Seconds to wait before restarting a child that crashed at `now`, given when it
        was restarted before (same clock), or None when its restarts in the window are spent."""
        recent = sum(1 for at in restarts if now - at < self.window_s)
        if recent >= self.max_restarts:
            return None
        return min(self.backoff_s * 2**recent, self.max_backoff_s)
