"""Where a prompt is computed (libs/gateway/serving/route.py): each rule, in its order."""

from __future__ import annotations

from dataclasses import replace

import pytest

from libs.gateway.serving.disaggregation import DisaggConfig, DisaggInputs
from libs.gateway.serving.route import Route, RouteFacts, choose_route, needs_stored_prefix

ALWAYS = DisaggConfig()
CONDITIONAL = DisaggConfig(policy="conditional", local_prefill_max_tokens=100)
PLAIN = RouteFacts(
    colocated=False, has_images=False, prompt_tokens=1000, stored_tokens=0, stored_prefix_max_tail=256
)


def placement(prompt: int, cached: int = 0, prefill_queue: int | None = 0) -> DisaggInputs:
    return DisaggInputs(
        prompt_tokens=prompt, cached_tokens=cached, prefill_queue=prefill_queue, decode_load=0
    )


def test_a_colocated_worker_computes_its_prompt_whatever_else_is_true() -> None:
    facts = replace(PLAIN, colocated=True, has_images=True, stored_tokens=1000, placement=placement(3))
    assert choose_route(facts, CONDITIONAL).route is Route.COLOCATED


def test_images_always_go_through_a_prefill_worker() -> None:
    facts = replace(PLAIN, has_images=True, stored_tokens=1000, placement=placement(3))
    choice = choose_route(facts, CONDITIONAL)
    assert (choice.route, choice.placement) == (Route.REMOTE_PREFILL, None)


@pytest.mark.parametrize(
    ("stored", "route"),
    [
        (800, Route.STORED_PREFIX),
        (744, Route.STORED_PREFIX),
        (743, Route.REMOTE_PREFILL),
        (0, Route.REMOTE_PREFILL),
    ],
)
def test_a_stored_prefix_skips_prefill_only_with_a_short_enough_tail(stored: int, route: Route) -> None:
    assert choose_route(replace(PLAIN, stored_tokens=stored), ALWAYS).route is route


def test_conditional_disaggregation_decides_last_and_its_decision_is_returned() -> None:
    short = replace(PLAIN, prompt_tokens=50, placement=placement(50))
    choice = choose_route(short, CONDITIONAL)
    assert choice.route is Route.LOCAL_PREFILL and choice.placement is not None
    assert choice.placement.reason == "short_prompt"
    long = replace(PLAIN, placement=placement(1000))
    assert choose_route(long, CONDITIONAL).route is Route.REMOTE_PREFILL
    # A stored prefix wins before the policy is asked.
    stored = replace(short, prompt_tokens=1000, stored_tokens=900)
    assert choose_route(stored, CONDITIONAL).placement is None


def test_the_always_policy_prefills_remotely_without_consulting_placement() -> None:
    choice = choose_route(replace(PLAIN, prompt_tokens=5, placement=placement(5)), ALWAYS)
    assert (choice.route, choice.placement) == (Route.REMOTE_PREFILL, None)
    assert choice.route.prefills_remotely and not Route.LOCAL_PREFILL.prefills_remotely


def test_the_kvstore_is_asked_only_when_its_answer_can_change_the_route() -> None:
    assert needs_stored_prefix(colocated=False, has_images=False)
    assert not needs_stored_prefix(colocated=True, has_images=False)
    assert not needs_stored_prefix(colocated=False, has_images=True)
