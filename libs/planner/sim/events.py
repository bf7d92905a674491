"""The simulation's clock: callbacks ordered by simulated time (ties in the order scheduled)."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable


class EventLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()

    def at(self, when: float, callback: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (max(when, self.now), next(self._order), callback))

    def after(self, delay: float, callback: Callable[[], None]) -> None:
        self.at(self.now + delay, callback)

    def run_until(self, end: float, stop: Callable[[], bool] = lambda: False) -> None:
        """Runs events up to `end` (simulated seconds) or until `stop()` says so."""
        while self._queue and self._queue[0][0] <= end:
            when, _, callback = heapq.heappop(self._queue)
            self.now = when
            callback()
            if stop():
                return
        if self._queue and self._queue[0][0] > end:
            self.now = max(self.now, end)  # stopped at `end` with events after it

    @property
    def pending(self) -> int:
        return len(self._queue)
