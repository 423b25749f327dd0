"""Per-tenant limits at the gateway (services/gateway/limits.py) on a fake clock."""

from __future__ import annotations

import pytest

from libs.contracts import TenantLimits
from services.gateway.errors import GatewayError
from services.gateway.limits import TenantLimiter, estimate_tokens


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limiter(defaults=TenantLimits(), throttled=None):
    clock = Clock()
    sink = throttled if throttled is not None else []
    return TenantLimiter(defaults, clock=clock, on_throttle=lambda t, lim: sink.append((t, lim))), clock


def refused(lim, tenant, limits, tokens=10) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        lim.admit(tenant, limits, tokens)
    assert caught.value.status == 429 and caught.value.code == "rate_limit_exceeded"
    assert caught.value.body()["error"]["type"] == "rate_limit_error"  # OpenAI's shape: RateLimitError
    return caught.value


def test_requests_per_second_is_a_bucket_of_one_seconds_worth():
    throttled = []
    lim, clock = limiter(throttled=throttled)
    limits = TenantLimits(rps=2)
    lim.admit("a", limits, 10)
    lim.admit("a", limits, 10)
    error = refused(lim, "a", limits)
    assert error.headers == {"Retry-After": "1"} and "2 requests per second" in error.message
    assert throttled == [("a", "rps")]
    lim.admit("b", limits, 10)  # another tenant has its own bucket
    clock.now += 0.5
    lim.admit("a", limits, 10)  # half a second refills one
    refused(lim, "a", limits)
    clock.now += 10  # never more than one second's worth
    for _ in range(2):
        lim.admit("a", limits, 10)
    refused(lim, "a", limits)


def test_a_slow_rate_says_how_long_to_wait():
    lim, _ = limiter()
    lim.admit("a", TenantLimits(rps=0.1), 10)
    assert refused(lim, "a", TenantLimits(rps=0.1)).headers["Retry-After"] == "10"


def test_concurrency_counts_requests_until_released():
    lim, _ = limiter()
    limits = TenantLimits(concurrency=2)
    first, second = lim.admit("a", limits, 1), lim.admit("a", limits, 1)
    refused(lim, "a", limits)
    lim.release(first, 5)
    lim.release(first, 5)  # a second release of the same ticket changes nothing
    assert lim.in_flight("a") == 1
    lim.admit("a", limits, 1)
    refused(lim, "a", limits)
    lim.release(second)
    assert lim.in_flight("a") == 1


def test_tokens_per_minute_charges_the_estimate_and_keeps_what_was_really_used():
    lim, clock = limiter()
    limits = TenantLimits(tpm=1000)
    ticket = lim.admit("a", limits, 600)
    refused(lim, "a", limits, 600)  # 600 + 600 > 1000
    lim.release(ticket, 100)  # it used 100 of its 600
    lim.admit("a", limits, 600)  # 100 + 600 fits now
    error = refused(lim, "a", limits, 600)
    assert 1 <= int(error.headers["Retry-After"]) <= 60
    clock.now += 60  # the window moved on
    lim.admit("a", limits, 600)


def test_a_request_bigger_than_the_whole_minute_is_refused_with_the_reason():
    lim, _ = limiter()
    error = refused(lim, "a", TenantLimits(tpm=100), 500)
    assert "lower max_tokens" in error.message


def test_own_limits_win_over_the_pool_defaults_and_unset_means_unlimited():
    lim, _ = limiter(defaults=TenantLimits(concurrency=1))
    lim.admit("a", None, 1)
    refused(lim, "a", None)  # the default
    lim.admit("b", TenantLimits(concurrency=3), 1)
    lim.admit("b", TenantLimits(concurrency=3), 1)  # its own, higher
    free, _ = limiter()
    for _ in range(1000):
        free.admit("c", None, 10**6)


def test_a_refused_request_counts_nothing():
    lim, _ = limiter()
    limits = TenantLimits(rps=1, concurrency=5, tpm=100)
    lim.admit("a", limits, 50)
    for _ in range(5):
        refused(lim, "a", limits, 50)
    assert lim.in_flight("a") == 1


def test_estimate_is_prompt_characters_over_four_plus_max_tokens():
    assert estimate_tokens(0, 16) == 16
    assert estimate_tokens(401, 128) == 101 + 128


@pytest.mark.parametrize(
    "bad",
    [
        {"rps": 0},
        {"rps": -1},
        {"tpm": 0},
        {"concurrency": -3},
        {"rps": 1e12},
        {"tpm": 10**12},
        {"concurrency": 10**7},
        {"burst": 3},
    ],
)
def test_zero_negative_absurd_or_unknown_limits_are_refused(bad):
    with pytest.raises(ValueError):
        TenantLimits(**bad)
