"""Early refusal of what the pool cannot finish before its deadline (services/gateway/overload.py)."""

from __future__ import annotations

import pytest

from services.gateway.errors import GatewayError
from services.gateway.overload import OverloadGuard


def measured(service_s: float, samples: int = 5) -> OverloadGuard:
    guard = OverloadGuard(min_samples=5)
    for _ in range(samples):
        guard.observe("p", service_s)
    return guard


def test_no_refusal_before_enough_requests_were_measured():
    guard = measured(10.0, samples=4)
    assert guard.expected_finish_s("p", load=10_000, capacity=1) is None
    guard.check("p", "w", load=10_000, capacity=1, time_left_s=1)  # no guess, no refusal


def test_expected_finish_grows_with_the_queue_ahead_in_rounds_of_capacity():
    guard = measured(4.0)
    assert guard.expected_finish_s("p", load=0, capacity=16) == 4.0  # a free slot: one service time
    assert guard.expected_finish_s("p", load=15, capacity=16) == 4.0
    assert guard.expected_finish_s("p", load=16, capacity=16) == pytest.approx(4.25)
    assert guard.expected_finish_s("p", load=47, capacity=16) == pytest.approx(4.0 * 3)


def test_a_request_that_would_miss_its_deadline_gets_503_with_retry_after_at_once():
    guard = measured(8.0)
    guard.check("p", "w", load=200, capacity=16, time_left_s=120)  # ~100 s: fits
    with pytest.raises(GatewayError) as caught:
        guard.check("p", "w", load=400, capacity=16, time_left_s=120)  # ~200 s
    error = caught.value
    assert error.status == 503 and error.code == "pool_overloaded"
    assert error.headers["Retry-After"] == "81" and "120 s deadline" in error.message


def test_the_average_follows_the_measurements():
    guard = measured(1.0)
    for _ in range(50):
        guard.observe("p", 9.0)
    assert guard.service_s("p") == pytest.approx(9.0, rel=0.01)
    guard.observe("p", 0.0)  # a result without timings changes nothing
    assert guard.service_s("p") == pytest.approx(9.0, rel=0.01)
    assert guard.service_s("other") is None
