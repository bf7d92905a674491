"""A worker's bound on the requests it runs at once, whichever gateways sent them.

Why at the worker: each gateway bounds what it sends one worker (libs/gateway/fleet/admission.py),
but G gateways would together send G times that, and agreeing on a shared count would need a
central lock on every request. The worker is the one place that sees every request, so the
bound holds fleet-wide only if the worker enforces it: a request beyond it is refused before
anything of it runs (RESOURCE_EXHAUSTED, libs/rpc/at_capacity.py), and the gateway that sent
it waits for room, on this worker or another, as it waits for its own bound. The count goes
out with each GenerateMany message and each stats poll, so gateways route around a full
worker instead of being refused by it.

The default bound is twice the engine's max_num_seqs, the gateway's own default per worker:
one batch running and one waiting in the engine, so the batch stays full while the next
requests prefill or pull their KV.
"""

from __future__ import annotations

from collections.abc import Iterator

from libs.rpc import at_capacity
from libs.rpc.errors import AtCapacity
from libs.worker import metrics

# The bound per engine batch slot when --max-inflight-requests is 0.
DEFAULT_PER_SEQ = 2


def default_limit(max_num_seqs: int) -> int:
    return DEFAULT_PER_SEQ * max(max_num_seqs, 1)


class InflightRequests:
    """The ids of the requests running on this worker, at most `limit` of them."""

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"the in-flight bound must be positive, not {limit}")
        self.limit = limit
        self._ids: set[str] = set()
        metrics.INFLIGHT_LIMIT.set(limit)

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._ids

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._ids))

    def admit(self, request_id: str) -> None:
        """Counts the request in, or raises AtCapacity (nothing of it has run)."""
        if len(self._ids) >= self.limit:
            metrics.REFUSED_AT_CAPACITY.inc()
            raise AtCapacity(
                at_capacity.message(
                    f"this worker runs its limit of {self.limit} requests; retry when one ends"
                )
            )
        self._ids.add(request_id)
        metrics.INFLIGHT.set(len(self._ids))

    def discard(self, request_id: str) -> None:
        self._ids.discard(request_id)
        metrics.INFLIGHT.set(len(self._ids))
