"""What the edge needs to know about the model its workers serve, as one typed object.

Workers report their facts once (WorkerInfo, asked when each first answers a poll: pool.py);
`ModelFacts.of` folds every known worker's into what all of them can serve, and `FleetFacts`
folds them again whenever the pool's workers change. A fact the edge needs is a WorkerInfo
field, a field here and its use: nothing is copied by hand in between. One `FleetFacts` per
served model: a second model is a second pool and a second object.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from cleave.worker.v1 import worker_pb2
from libs.gateway.fleet.pool import WorkerPool


@dataclass(frozen=True)
class ModelFacts:
    model: str  # the name clients ask for (the served model name)
    max_model_len: int  # prompt + completion tokens every worker takes
    # Token ids below it are valid on every worker; None while no worker has said.
    vocab_size: int | None = None
    # max_tokens for requests that set none: the model's generation_config.json under
    # `--generation-config auto`; None = the rest of the context.
    default_max_tokens: int | None = None
    # The workers' --max-logprobs (-1 = the vocabulary; None = vLLM's default).
    max_logprobs: int | None = None
    # A vision-language model: without an encoder service the workers encode images themselves.
    takes_images: bool = False
    # The most tokens one engine step schedules (vLLM's max_num_batched_tokens).
    max_num_batched_tokens: int | None = None

    @classmethod
    def of(cls, infos: Sequence[worker_pb2.WorkerInfo], served_model: str = "") -> ModelFacts:
        """What every one of the workers in `infos` (at least one) can serve: the smallest
        bound any of them reports, a capability only when all have it."""
        first = infos[0]
        return cls(
            model=served_model or first.model,
            max_model_len=min(i.max_model_len for i in infos),
            vocab_size=_smallest(i.vocab_size for i in infos if i.vocab_size > 0),
            default_max_tokens=_smallest(
                i.default_max_tokens for i in infos if i.HasField("default_max_tokens")
            ),
            max_logprobs=_smallest_logprobs([i.max_logprobs for i in infos if i.HasField("max_logprobs")]),
            takes_images=all(i.takes_images for i in infos),
            max_num_batched_tokens=_smallest(
                i.max_num_batched_tokens for i in infos if i.max_num_batched_tokens > 0
            ),
        )


class FactsSource(Protocol):
    """Where the edge reads the current facts (a fixed object in tests)."""

    @property
    def current(self) -> ModelFacts: ...


class FleetFacts:
    """The facts of the workers a pool knows, folded again when its workers change."""

    def __init__(self, pool: WorkerPool, first: worker_pb2.WorkerInfo, served_model: str = "") -> None:
        self._pool = pool
        self._served_model = served_model
        self._infos: tuple[worker_pb2.WorkerInfo, ...] = (first,)
        self._current = ModelFacts.of(self._infos, served_model)
        pool.listeners.append(self._refresh)

    @property
    def current(self) -> ModelFacts:
        return self._current

    def _refresh(self) -> None:
        infos = tuple(e.info for e in self._pool.endpoints if e.info is not None)
        if infos and [id(i) for i in infos] != [id(i) for i in self._infos]:
            self._infos = infos
            self._current = ModelFacts.of(infos, self._served_model)


def _smallest(values: Iterable[int]) -> int | None:
    found = list(values)
    return min(found) if found else None


def _smallest_logprobs(values: list[int]) -> int | None:
    """-1 means the whole vocabulary: larger than any other bound."""
    if not values:
        return None
    bounded = [v for v in values if v != -1]
    return min(bounded) if bounded else -1
