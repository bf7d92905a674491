from __future__ import annotations

import pytest

from libs.config.roles import Role
from libs.planner.observe import FleetObserver, Scrape, histogram_quantile


def test_histogram_quantile_interpolates_within_a_bucket_as_prometheus() -> None:
    buckets = {0.1: 10.0, 0.2: 30.0, 0.4: 40.0, float("inf"): 40.0}
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.15)
    assert histogram_quantile(0.9, buckets) == pytest.approx(0.32)
    assert histogram_quantile(0.5, {0.1: 0.0, float("inf"): 0.0}) is None
    assert histogram_quantile(0.99, {0.1: 1.0, float("inf"): 10.0}) == 0.1  # the open bucket


def gateway(prompts: int, prompt_tokens: int, ttft_le_02: int, queue: int, workers: str = "") -> str:
    return f"""# TYPE cleave_gateway_prompt_tokens histogram
cleave_gateway_prompt_tokens_bucket{{le="+Inf"}} {prompts}
cleave_gateway_prompt_tokens_count {prompts}
cleave_gateway_prompt_tokens_sum {prompt_tokens}
# TYPE cleave_gateway_completion_tokens histogram
cleave_gateway_completion_tokens_count {prompts}
cleave_gateway_completion_tokens_sum {prompts * 10}
# TYPE cleave_gateway_ttft_seconds histogram
cleave_gateway_ttft_seconds_bucket{{le="0.2"}} {ttft_le_02}
cleave_gateway_ttft_seconds_bucket{{le="1.0"}} {prompts}
cleave_gateway_ttft_seconds_bucket{{le="+Inf"}} {prompts}
cleave_gateway_ttft_seconds_count {prompts}
cleave_gateway_ttft_seconds_sum 0
# TYPE cleave_gateway_queue_depth gauge
cleave_gateway_queue_depth {queue}
{workers}"""


WORKERS = """# TYPE cleave_gateway_worker_routable gauge
cleave_gateway_worker_routable{worker="10.0.0.1:1",role="prefill"} 1
cleave_gateway_worker_routable{worker="10.0.0.2:1",role="decode"} 1
cleave_gateway_worker_routable{worker="10.0.0.3:1",role="decode"} 0
# TYPE cleave_gateway_worker_running gauge
cleave_gateway_worker_running{worker="10.0.0.1:1",role="prefill"} 2
cleave_gateway_worker_running{worker="10.0.0.2:1",role="decode"} 7
# TYPE cleave_gateway_worker_waiting gauge
cleave_gateway_worker_waiting{worker="10.0.0.2:1",role="decode"} 3
# TYPE cleave_gateway_worker_kv_cache_usage gauge
cleave_gateway_worker_kv_cache_usage{worker="10.0.0.2:1",role="decode"} 0.5
"""


def test_windows_sum_the_gateways_and_count_a_worker_once() -> None:
    observer = FleetObserver(quantile=0.5)
    first = observer.observe(
        100.0,
        [
            Scrape.parse("a", gateway(10, 1000, 10, 0, WORKERS)),
            Scrape.parse("b", gateway(5, 500, 5, 0, WORKERS)),
        ],
    )
    assert first.window_s == 0 and first.arrival_rate == 0  # a baseline only
    second = observer.observe(
        110.0,
        [
            Scrape.parse("a", gateway(30, 5000, 20, 2, WORKERS)),
            Scrape.parse("b", gateway(15, 1500, 5, 1, WORKERS)),
        ],
        starting={Role.DECODE: 1},
    )
    assert second.window_s == 10
    assert second.arrival_rate == pytest.approx(3.0)  # 20 + 10 requests in 10 s
    assert second.isl_mean == pytest.approx((4000 + 1000) / 30)
    assert second.osl_mean == pytest.approx(10)
    # TTFT: 10 of 30 new ones under 0.2 s; the median is in (0.2, 1.0].
    assert second.ttft_q == pytest.approx(0.2 + 0.8 * (15 - 10) / 20)
    assert second.queue_depth == 3
    decode = second.role(Role.DECODE)
    assert (decode.ready, decode.starting, decode.running, decode.waiting, decode.kv_usage) == (
        1,
        1,
        7,
        3,
        0.5,
    )
    assert second.role(Role.PREFILL).ready == 1 and second.role(Role.PREFILL).running == 2


def test_a_restarted_gateway_counts_from_zero() -> None:
    observer = FleetObserver(quantile=0.5)
    observer.observe(0.0, [Scrape.parse("a", gateway(100, 10000, 100, 0))])
    after = observer.observe(10.0, [Scrape.parse("a", gateway(20, 2000, 20, 0))])
    assert after.arrival_rate == pytest.approx(2.0)
    assert after.isl_mean == pytest.approx(100)
