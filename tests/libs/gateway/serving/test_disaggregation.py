"""Conditional disaggregation's decision: a pure function of the request's facts and the
thresholds, and the load figures the pipeline feeds it."""

from __future__ import annotations

import pytest

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2
from libs.gateway.common import metrics
from libs.gateway.common.generation import GenerationSpec
from libs.gateway.config import parse_args
from libs.gateway.fleet.pool import Endpoint
from libs.gateway.fleet.routing import create_policy
from libs.gateway.serving.disaggregation import (
    DisaggConfig,
    DisaggInputs,
    PrefixEstimate,
    decide,
    decode_load,
    prefill_queue,
    record,
)
from libs.gateway.serving.picking import picker


def spec(prompt: list[int], cache_salt: str) -> GenerationSpec:
    return GenerationSpec("r", "m", prompt, common_pb2.SamplingParams(), [], cache_salt=cache_salt)


CONDITIONAL = DisaggConfig(
    policy="conditional",
    local_prefill_max_tokens=256,
    remote_prefill_max_queue=4,
    local_prefill_max_decode_load=2,
)


def inputs(
    prompt: int = 1000, cached: int = 0, queue: int | None = 0, decode: int = 0, logprobs: bool = False
) -> DisaggInputs:
    return DisaggInputs(
        prompt_tokens=prompt,
        cached_tokens=cached,
        prefill_queue=queue,
        decode_load=decode,
        prompt_logprobs=logprobs,
    )


def endpoint(address: str, role: str, admitted: int = 0, running: int = 0, waiting: int = 0) -> Endpoint:
    stats = worker_pb2.WorkerStats(num_running=running, num_waiting=waiting)
    return Endpoint(address, role, None, None, healthy=True, stats=stats, admitted=admitted)  # type: ignore[arg-type]


def test_always_is_remote_whatever_the_prompt() -> None:
    always = DisaggConfig()
    for facts in (inputs(prompt=1), inputs(queue=None), inputs(queue=100)):
        assert decide(always, facts).remote
        assert decide(always, facts).reason == "policy_always"


@pytest.mark.parametrize(
    ("facts", "remote", "reason"),
    [
        (inputs(prompt=256), False, "short_prompt"),  # at the threshold: local
        (inputs(prompt=257), True, "long_prompt"),
        # What the decode worker can reuse does not count: 1,000 tokens, 800 cached.
        (inputs(prompt=1000, cached=800), False, "short_prompt"),
        (inputs(prompt=1000, cached=700), True, "long_prompt"),
        (inputs(prompt=10, queue=None), False, "no_prefill_worker"),
        (inputs(prompt=5000, queue=None), False, "no_prefill_worker"),
        (inputs(prompt=10, logprobs=True), True, "prompt_logprobs"),
        # Prefill backed up, decode has room: local.
        (inputs(prompt=2000, queue=4, decode=1), False, "prefill_queue"),
        (inputs(prompt=2000, queue=3, decode=0), True, "long_prompt"),
        # Prefill backed up but decode busy too: the prompt waits for the prefill worker.
        (inputs(prompt=2000, queue=9, decode=2), True, "long_prompt"),
    ],
)
def test_conditional_rules(facts: DisaggInputs, remote: bool, reason: str) -> None:
    decision = decide(CONDITIONAL, facts)
    assert (decision.remote, decision.reason) == (remote, reason)
    assert decision.outcome == ("remote" if remote else "local")


def test_thresholds_move_the_boundary() -> None:
    all_local = DisaggConfig(policy="conditional", local_prefill_max_tokens=10**9)
    never_short = DisaggConfig(policy="conditional", local_prefill_max_tokens=0)
    assert not decide(all_local, inputs(prompt=100_000)).remote
    assert decide(never_short, inputs(prompt=1)).remote
    assert not decide(never_short, inputs(prompt=0)).remote  # nothing uncached


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown disaggregation policy 'sometimes'"):
        DisaggConfig(policy="sometimes")


def test_load_figures_take_the_fresher_or_larger_count() -> None:
    assert prefill_queue([]) is None
    busy = endpoint("a", "prefill", admitted=5)
    polled = endpoint("b", "prefill", admitted=1, running=2, waiting=1)  # others' requests too
    assert prefill_queue([busy, polled]) == 3
    # The decode slot of the request being placed is held already: not counted as load.
    assert decode_load(endpoint("d", "decode", admitted=1)) == 0
    assert decode_load(endpoint("d", "decode", admitted=3)) == 2
    assert decode_load(endpoint("d", "decode", admitted=1, running=4)) == 4


def test_prefix_estimate_reads_affinity_before_the_pick_records() -> None:
    policy = create_policy("prefix_affinity")
    a, b = endpoint("a", "decode"), endpoint("b", "decode")
    prompt = list(range(600))  # two full 256-token blocks
    estimate = PrefixEstimate(policy)
    estimate.observe([a, b], prompt)
    chosen = policy.pick([a, b], prompt)
    assert estimate.cached_tokens(chosen.address) == 0  # first time: nothing cached anywhere
    again = PrefixEstimate(policy)
    again.observe([a, b], prompt)
    assert again.cached_tokens(chosen.address) == 512
    # A salted request's prefix is its salt's own: no estimate across salts, as picker() passes it.
    salted = PrefixEstimate(policy)
    salted.observe([a, b], prompt, "key-1")
    assert salted.cached_tokens(chosen.address) == 0
    first_salted = picker(policy, spec(prompt, "key-1"), salted)([a, b])
    again_salted = PrefixEstimate(policy)
    picker(policy, spec(prompt, "key-1"), again_salted)([a, b])
    assert again_salted.cached_tokens(first_salted.address) == 512
    # Other policies keep no prefix record: estimate 0.
    other = PrefixEstimate(create_policy("least_load"))
    other.observe([a, b], prompt)
    assert other.cached_tokens("a") == 0


def test_each_decision_is_counted_by_outcome_and_reason() -> None:
    counter = metrics.DISAGG_DECISIONS.labels("local", "short_prompt")
    before = counter._value.get()
    decision = decide(CONDITIONAL, inputs(prompt=3))
    record(decision, inputs(prompt=3), request_id="r-7", decode="d")
    assert not decision.remote
    assert counter._value.get() == before + 1


def test_flags_parse_and_render_back() -> None:
    config = parse_args(
        [
            "--disagg-policy", "conditional",
            "--local-prefill-max-tokens", "128",
            "--remote-prefill-max-queue", "2",
            "--local-prefill-max-decode-load", "5",
        ]
    )  # fmt: skip
    assert config.disagg() == DisaggConfig("conditional", 128, 2, 5)
    assert parse_args([]).disagg() == DisaggConfig()  # opt-in: always by default
    from libs.config.flags import render

    assert parse_args(render(config)).disagg() == config.disagg()
