"""The model's facts as the edge reads them (libs/gateway/fleet/facts.py): every worker's folded
into what all of them serve, and folded again when the pool's workers change."""

from __future__ import annotations

import pytest

from cleave.worker.v1 import worker_pb2
from libs.gateway.fleet.facts import FleetFacts, ModelFacts
from tests.libs.gateway.fake_workers import FakeWorker, fake_pool

pytestmark = pytest.mark.anyio


def info(**fields: object) -> worker_pb2.WorkerInfo:
    defaults: dict[str, object] = {"model": "smol", "max_model_len": 2048, "vocab_size": 100}
    return worker_pb2.WorkerInfo(**{**defaults, **fields})  # type: ignore[arg-type]


def test_one_workers_facts() -> None:
    facts = ModelFacts.of([info(default_max_tokens=64, max_logprobs=5, max_num_batched_tokens=512)])
    assert facts == ModelFacts("smol", 2048, 100, 64, 5, False, 512)
    assert ModelFacts.of([info()], served_model="alias").model == "alias"
    unset = ModelFacts.of([worker_pb2.WorkerInfo(model="m", max_model_len=8)])
    assert (unset.vocab_size, unset.default_max_tokens, unset.max_logprobs, unset.max_num_batched_tokens) == (
        None,
    ) * 4


def test_several_workers_fold_into_what_every_one_serves() -> None:
    facts = ModelFacts.of(
        [
            info(
                max_model_len=4096,
                vocab_size=100,
                max_logprobs=-1,
                takes_images=True,
                max_num_batched_tokens=2048,
            ),
            info(max_model_len=2048, vocab_size=99, max_logprobs=20, takes_images=False),
        ]
    )
    assert (facts.max_model_len, facts.vocab_size, facts.max_logprobs) == (2048, 99, 20)
    assert facts.takes_images is False and facts.max_num_batched_tokens == 2048
    assert ModelFacts.of([info(max_logprobs=-1), info(max_logprobs=-1)]).max_logprobs == -1


async def test_the_fleets_facts_follow_its_workers() -> None:
    pool = await fake_pool({"decode": [FakeWorker()]})
    first = info(max_model_len=4096)
    facts = FleetFacts(pool, first)
    assert facts.current.max_model_len == 4096
    pool.listeners[-1]()  # a poll round: the polled worker's own info (FakeWorker: 2048) counts now
    assert facts.current.max_model_len == 2048
    same = facts.current
    pool.listeners[-1]()
    assert facts.current is same  # nothing changed: nothing folded again
