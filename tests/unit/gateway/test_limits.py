"""Per-tenant limits at the gateway (services/gateway/limits.py) on a fake clock."""

from __future__ import annotations

import pytest

from libs.contracts import TenantLimits
from services.gateway.errors import GatewayError
from services.gateway.limits import RateLimited, TenantLimiter, estimate_tokens


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
        {"weight": 0},
        {"weight": -2},
        {"weight": 1e6},
        {"burst": 3},
    ],
)
def test_zero_negative_absurd_or_unknown_limits_are_refused(bad):
    with pytest.raises(ValueError):
        TenantLimits(**bad)


# --- several gateway replicas: each charges the others' reports ----------------------------------------
def replicas(n: int, clock: Clock | None = None):
    clock = clock or Clock()
    return [TenantLimiter(TenantLimits(), clock=clock) for _ in range(n)], clock


def sync(limiters: list[TenantLimiter]) -> None:
    """One report round: every replica tells every other what it admitted (what LimitSync carries)."""
    reports = [(i, lim.take_report()) for i, lim in enumerate(limiters)]
    for i, report in reports:
        for j, other in enumerate(limiters):
            if i != j:
                for tenant, (requests, tokens, in_flight) in report.items():
                    other.charge_remote(f"gw-{i}", tenant, requests, tokens, in_flight)


def admitted_count(limiter: TenantLimiter, tenant: str, limits: TenantLimits, tries: int, tokens: int = 10) -> int:
    count = 0
    for _ in range(tries):
        try:
            limiter.admit(tenant, limits, tokens)
            count += 1
        except GatewayError:
            pass
    return count


def test_three_replicas_hold_a_rate_together_within_one_burst_each():
    (a, b, c), clock = replicas(3)
    limits = TenantLimits(rps=4)
    total = 0
    for _ in range(50):  # 5 s of traffic spread over three gateways, reports every 100 ms
        for replica in (a, b, c):
            total += admitted_count(replica, "t", limits, tries=2)
        sync([a, b, c])
        clock.now += 0.1
    # 4/s for 5 s = 20, plus at most one burst (4) per other replica before the first report lands
    assert 20 <= total <= 20 + 2 * 4, total
    alone = TenantLimiter(TenantLimits(), clock=Clock())  # without reports each replica gives the whole rate
    assert admitted_count(alone, "t", limits, tries=100) == 4


def test_requests_in_flight_count_across_replicas_and_a_silent_replica_stops_counting():
    (a, b), clock = replicas(2)
    limits = TenantLimits(concurrency=2)
    a.admit("t", limits, 10)
    a.admit("t", limits, 10)
    sync([a, b])
    refused(b, "t", limits)  # a has both places
    clock.now += 2.0
    refused(b, "t", limits)
    clock.now += 1.5  # a has not reported for 3.5 s (gone): its count is dropped
    b.admit("t", limits, 10)


def test_a_replica_that_answers_reports_its_tenant_idle_once():
    (a, b), clock = replicas(2)
    limits = TenantLimits(concurrency=1)
    ticket = a.admit("t", limits, 10)
    sync([a, b])
    refused(b, "t", limits)
    a.release(ticket, 12)
    assert a.take_report() == {"t": (0, 2, 0)}  # the correction (12 used, 10 charged) and now idle
    assert a.take_report() == {}  # nothing more to say
    b.charge_remote("gw-0", "t", 0, 2, 0)
    b.admit("t", limits, 10)


def test_tokens_per_minute_count_the_other_replicas_real_use():
    (a, b), clock = replicas(2)
    limits = TenantLimits(tpm=100)
    ticket = a.admit("t", limits, 60)
    a.release(ticket, 90)  # it really used 90
    sync([a, b])
    error = refused(b, "t", limits, tokens=20)
    assert "100 tokens per minute" in error.message
    clock.now += 61
    b.admit("t", limits, 20)


def test_a_request_that_can_never_fit_is_not_worth_waiting_for():
    lim, _ = limiter()
    with pytest.raises(RateLimited) as caught:
        lim.admit("t", TenantLimits(tpm=100), 500)
    assert caught.value.retryable is False
    lim.admit("t", TenantLimits(rps=1), 5)
    with pytest.raises(RateLimited) as caught:
        lim.admit("t", TenantLimits(rps=1), 5)
    assert caught.value.retryable is True and caught.value.retry_after_s == pytest.approx(1.0)


def test_other_replicas_admissions_build_no_debt_beyond_a_second_nor_while_there_was_no_limit():
    (a, b), clock = replicas(2)
    a.admit("t", TenantLimits(), 10)  # no rps limit here: others' admissions are not counted against one
    for _ in range(50):
        a.charge_remote("gw-1", "t", 100, 0, 0)
    a.admit("t", TenantLimits(rps=2), 10)  # a limit arrives: the tenant starts from a full bucket
    for _ in range(50):
        a.charge_remote("gw-1", "t", 100, 0, 0)  # 5,000 admitted elsewhere in an instant
    refused(a, "t", TenantLimits(rps=2))
    clock.now += 1.5  # one second's worth of debt at most: refilled within about 1.5 s
    a.admit("t", TenantLimits(rps=2), 10)
