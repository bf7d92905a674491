"""The restart policy: a backoff that doubles with each restart in the window, capped, and a
budget per window after which a crashing child stays down."""

from __future__ import annotations

from libs.stack.restarts import RestartPolicy

POLICY = RestartPolicy(backoff_s=1.0, max_backoff_s=30.0, max_restarts=7, window_s=600.0)


def test_the_first_restart_waits_the_base_backoff() -> None:
    assert POLICY.delay([], now=1000.0) == 1.0


def test_each_recent_restart_doubles_the_wait_up_to_the_cap() -> None:
    history: list[float] = []
    delays = []
    for now in range(1000, 1007):
        delays.append(POLICY.delay(history, now=float(now)))
        history.append(float(now))
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_the_budget_per_window_is_enforced_and_old_restarts_fall_out_of_it() -> None:
    policy = RestartPolicy(backoff_s=1.0, max_backoff_s=30.0, max_restarts=2, window_s=60.0)
    assert policy.delay([100.0, 110.0], now=120.0) is None  # two in the last minute: stay down
    assert policy.delay([100.0, 110.0], now=165.0) == 2.0  # the first fell out of the window
    assert policy.delay([100.0, 110.0], now=200.0) == 1.0


def test_a_budget_of_zero_never_restarts() -> None:
    assert RestartPolicy(max_restarts=0).delay([], now=0.0) is None
