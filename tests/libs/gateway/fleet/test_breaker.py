"""The per-worker circuit breaker's transitions, on a clock the tests step."""

from __future__ import annotations

from prometheus_client import REGISTRY

from libs.config.roles import Role
from libs.gateway.fleet.breaker import BreakerConfig, BreakerState, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def state_of(b: CircuitBreaker) -> BreakerState:
    return b.state  # read afresh each time (a cool-down ends when the clock moves)


def breaker(clock: Clock, worker: str = "w:1", **config: float) -> CircuitBreaker:
    settings = BreakerConfig(**{"failures_to_open": 3, "cooldown_s": 5.0, "max_cooldown_s": 60.0, **config})  # type: ignore[arg-type]
    return CircuitBreaker(worker, Role.DECODE, settings, closed=True, clock=clock)


def test_k_consecutive_request_failures_open_and_a_success_resets_the_streak() -> None:
    b = breaker(Clock())
    b.request_failed("UNAVAILABLE")
    b.request_failed("UNAVAILABLE")
    b.request_succeeded()
    b.request_failed("UNAVAILABLE")
    b.request_failed("UNAVAILABLE")
    assert state_of(b) is BreakerState.CLOSED and b.available()
    b.request_failed("UNAVAILABLE")
    assert state_of(b) is BreakerState.OPEN and not b.available()


def test_answered_polls_do_not_hide_failing_requests() -> None:
    """A worker whose process answers polls but whose engine fails requests still opens."""
    b = breaker(Clock())
    for _ in range(2):
        b.request_failed("engine unavailable")
        b.poll_succeeded()
    b.request_failed("engine unavailable")
    assert state_of(b) is BreakerState.OPEN


def test_k_failed_polls_open_and_an_answered_one_resets_them() -> None:
    b = breaker(Clock())
    b.poll_failed("DEADLINE_EXCEEDED")
    b.poll_failed("DEADLINE_EXCEEDED")
    b.poll_succeeded()
    b.poll_failed("UNAVAILABLE")
    b.poll_failed("UNAVAILABLE")
    assert state_of(b) is BreakerState.CLOSED
    b.poll_failed("UNAVAILABLE")
    assert state_of(b) is BreakerState.OPEN


def test_after_the_cool_down_one_probe_request_goes_and_its_success_closes() -> None:
    clock = Clock()
    b = breaker(clock, failures_to_open=1)
    b.request_failed("UNAVAILABLE")
    clock.now += 4.9
    assert state_of(b) is BreakerState.OPEN
    b.poll_succeeded()  # an answered poll during the cool-down proves nothing yet
    assert state_of(b) is BreakerState.OPEN
    clock.now += 0.1
    assert state_of(b) is BreakerState.HALF_OPEN and b.available()
    b.start_request()
    assert not b.available()  # one probe at a time
    b.request_succeeded()
    b.end_request()
    assert state_of(b) is BreakerState.CLOSED and b.available()


def test_polls_that_failed_while_open_do_not_count_once_a_probe_closed_it() -> None:
    """A restarted worker: its polls failed while it was down; after the probe closed the
    breaker, one failed poll is the first of a new streak, not the third."""
    clock = Clock()
    b = breaker(clock)
    for _ in range(3):
        b.poll_failed("UNAVAILABLE")
    assert state_of(b) is BreakerState.OPEN
    b.poll_failed("UNAVAILABLE")
    b.poll_failed("UNAVAILABLE")
    clock.now += 5.0
    b.start_request()
    b.request_succeeded()
    b.end_request()
    assert state_of(b) is BreakerState.CLOSED
    b.poll_failed("DEADLINE_EXCEEDED")
    b.poll_failed("DEADLINE_EXCEEDED")
    assert state_of(b) is BreakerState.CLOSED
    b.poll_failed("DEADLINE_EXCEEDED")
    assert state_of(b) is BreakerState.OPEN


def test_a_probe_request_that_succeeds_closes_even_if_a_poll_probe_failed_meanwhile() -> None:
    clock = Clock()
    b = breaker(clock, failures_to_open=1)
    b.request_failed("UNAVAILABLE")
    clock.now += 5.0
    assert state_of(b) is BreakerState.HALF_OPEN
    b.start_request()
    b.poll_failed("DEADLINE_EXCEEDED")  # the poller's probe, while the request runs
    assert state_of(b) is BreakerState.OPEN
    b.request_succeeded()
    b.end_request()
    assert state_of(b) is BreakerState.CLOSED and b.available()


def test_an_answered_poll_after_the_cool_down_closes() -> None:
    clock = Clock()
    b = breaker(clock, failures_to_open=1)
    b.poll_failed("UNAVAILABLE")
    clock.now += 5
    b.poll_succeeded()
    assert state_of(b) is BreakerState.CLOSED


def test_a_probe_ending_without_an_outcome_lets_the_next_one_go() -> None:
    """A probe the client cancelled, or a request the worker refused as invalid, says nothing
    about the worker."""
    clock = Clock()
    b = breaker(clock, failures_to_open=1)
    b.request_failed("UNAVAILABLE")
    clock.now += 5
    b.start_request()
    b.end_request()
    assert state_of(b) is BreakerState.HALF_OPEN and b.available()


def test_a_failed_probe_reopens_with_a_doubled_cool_down_until_a_request_succeeds() -> None:
    clock = Clock()
    b = breaker(clock, failures_to_open=1, cooldown_s=5.0, max_cooldown_s=12.0)
    b.request_failed("UNAVAILABLE")
    assert b.cooldown_s == 5.0
    cooldowns = []
    for _ in range(3):
        clock.now += b.cooldown_s
        b.start_request()
        b.request_failed("UNAVAILABLE")
        b.end_request()
        cooldowns.append(b.cooldown_s)
    assert cooldowns == [10.0, 12.0, 12.0]
    clock.now += 12
    b.poll_succeeded()  # closed by a poll: the engine may still fail requests
    b.request_failed("UNAVAILABLE")
    assert b.cooldown_s == 12.0
    clock.now += 12
    b.request_succeeded()
    assert state_of(b) is BreakerState.CLOSED and b.cooldown_s == 5.0


def test_a_new_breaker_waits_for_the_first_answered_poll() -> None:
    b = CircuitBreaker("w:new", Role.PREFILL, clock=Clock())
    assert state_of(b) is BreakerState.HALF_OPEN
    b.poll_succeeded()
    assert state_of(b) is BreakerState.CLOSED


def test_state_and_transitions_are_metrics() -> None:
    def transitions(to: str) -> float:
        labels = {"worker": "w:metrics", "role": "decode", "to": to}
        return REGISTRY.get_sample_value("cleave_gateway_worker_breaker_transitions_total", labels) or 0.0

    def state() -> float | None:
        return REGISTRY.get_sample_value(
            "cleave_gateway_worker_breaker_state", {"worker": "w:metrics", "role": "decode"}
        )

    clock = Clock()
    b = breaker(clock, "w:metrics", failures_to_open=1)
    seen: list[BreakerState] = []
    b.listeners.append(seen.append)
    assert state() == 0
    b.request_failed("UNAVAILABLE")
    assert state() == 2 and transitions("open") == 1
    clock.now += 5
    assert state_of(b) is BreakerState.HALF_OPEN
    assert state() == 1 and transitions("half_open") == 1
    b.poll_succeeded()
    assert state() == 0 and transitions("closed") == 1
    assert seen == [BreakerState.OPEN, BreakerState.HALF_OPEN, BreakerState.CLOSED]


def test_a_worker_serving_again_is_probed_at_once_not_after_its_grown_cool_down() -> None:
    """A restarting worker's polls fail until it has loaded, each opening the breaker for
    twice as long; once its health says SERVING it is probed at once."""
    clock = Clock()
    b = breaker(clock, failures_to_open=1)
    for _ in range(4):  # 5, 10, 20, 40 s cool-downs while it restarts
        b.poll_failed("UNAVAILABLE")
        clock.now += b.cooldown_s
        assert state_of(b) is BreakerState.HALF_OPEN
    b.poll_failed("UNAVAILABLE")
    assert state_of(b) is BreakerState.OPEN and b.cooldown_s == 60.0
    b.serving_again()
    assert state_of(b) is BreakerState.HALF_OPEN and b.available()
    b.poll_succeeded()
    assert state_of(b) is BreakerState.CLOSED


def test_serving_again_does_not_reopen_or_close_a_breaker() -> None:
    clock = Clock()
    b = breaker(clock)
    b.serving_again()
    assert state_of(b) is BreakerState.CLOSED
    b = breaker(clock, failures_to_open=1)
    b.poll_failed("UNAVAILABLE")
    clock.now += b.cooldown_s
    b.serving_again()  # half-open already: health alone never closes it
    assert state_of(b) is BreakerState.HALF_OPEN
