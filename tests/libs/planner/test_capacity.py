from __future__ import annotations

from pathlib import Path

import pytest

from libs.planner.capacity import (
    Engine,
    Shape,
    capacity,
    colocated_capacity,
    decode_batch,
    decode_capacity,
    prefill_capacity,
    prompt_work,
)
from libs.planner.slo import Slo
from libs.planner.workload import Lengths
from tests.libs.planner.helpers import write_profile


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    return Engine.from_profile(write_profile(tmp_path))


def test_the_engine_is_read_from_the_profile(engine: Engine) -> None:
    assert engine.max_num_seqs == 8 and engine.max_num_batched_tokens == 256
    assert engine.kv_tokens == 64 * 32 * 16
    assert engine.coefficients.base_s == 0.01
    assert engine.transfer_s(1000) == pytest.approx(0.002)  # bandwidth 0: latency only


def test_a_decode_batch_keeps_its_quantile_under_max_num_seqs_or_the_itl(engine: Engine) -> None:
    shape = Shape.of_means(100, 100)
    loose = Slo(1.0, 1.0)  # the ITL allows 990 sequences: max_num_seqs (8) binds
    batch = decode_batch(engine, shape, loose)
    assert batch + 1.2816 * batch**0.5 == pytest.approx(8, rel=1e-3)
    tight = Slo(1.0, 0.015)  # t(B) = 10 ms + 1 ms * B <= 15 ms: 5 sequences
    assert decode_batch(engine, shape, tight) + 1.2816 * decode_batch(
        engine, shape, tight
    ) ** 0.5 == pytest.approx(5, rel=1e-3)
    assert decode_capacity(engine, shape, tight) < decode_capacity(engine, shape, loose)
    # Throughput: B sequences each needing E[O] steps of t(B).
    b = decode_batch(engine, shape, loose)
    assert decode_capacity(engine, shape, loose) == pytest.approx(b / ((0.01 + 0.001 * b) * 100))


def test_the_kv_cache_bounds_a_decode_batch(tmp_path: Path) -> None:
    small = Engine.from_profile(
        write_profile(
            tmp_path,
            scheduler_defaults={
                "max_num_seqs": 64,
                "max_num_batched_tokens": 256,
                "kv_cache_bytes": 30 * 3 * 64 * 2 * 2 * 16 * 65,
            },
        )
    )
    # 64 blocks of 16 tokens = 1024 tokens (one block is vLLM's null block): 2 sequences of 500.
    assert small.kv_tokens == 1024
    batch = decode_batch(small, Shape.of_means(400, 100), Slo(1.0, 1.0))
    assert batch + 1.2816 * batch**0.5 == pytest.approx(1024 / 500, rel=1e-3)


def test_prefill_capacity_is_below_saturation_and_grows_with_the_ttft_objective(engine: Engine) -> None:
    shape = Shape.of(Lengths.fixed(200, 0.5), Lengths.fixed(50))
    saturation = 1 / prompt_work(engine, shape)
    tight, loose = (
        prefill_capacity(engine, shape, Slo(0.1, 1.0)),
        prefill_capacity(engine, shape, Slo(2.0, 1.0)),
    )
    assert 0 < tight < loose < saturation
    # An objective below one prompt's own time cannot be met at any rate.
    assert prefill_capacity(engine, shape, Slo(0.02, 1.0)) == 0


def test_a_colocated_worker_with_long_prompts_fails_a_p99_itl_long_before_a_mean_one(engine: Engine) -> None:
    # 250-token prompts are one 35 ms step: a gap over a 30 ms objective for every request
    # decoding beside it; on average such steps are rare.
    shape = Shape.of(Lengths.fixed(250), Lengths.fixed(100))
    mean = colocated_capacity(engine, shape, Slo(2.0, 0.03, "mean"))
    p99 = colocated_capacity(engine, shape, Slo(2.0, 0.03, "p99"))
    assert 0 < p99 < mean / 3
    # Short prompts (a 2 ms chunk) do not break it.
    short = Shape.of(Lengths.fixed(20), Lengths.fixed(100))
    assert colocated_capacity(engine, short, Slo(2.0, 0.03, "p99")) == pytest.approx(
        colocated_capacity(engine, short, Slo(2.0, 0.03, "mean")), rel=0.05
    )


def test_capacity_of_every_role(engine: Engine) -> None:
    caps = capacity(engine, Shape.of_means(100, 100), Slo(0.5, 0.05))
    assert caps.prefill > 0 and caps.decode > 0 and caps.colocated > 0
    # A colocated worker does both jobs: less than either alone.
    assert caps.colocated < min(caps.prefill, caps.decode)
