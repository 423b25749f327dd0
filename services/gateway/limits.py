"""Per-tenant limits at the gateway: requests per second, tokens per minute, requests in flight.

Each tenant's limits come from the registry with its auth/resolve reply (cached like it; a change is
an event that drops the cache entry at every gateway); a limit left unset takes the pool default from
the gateway's settings; unset there too: no limit. Over a limit the caller gets 429 in OpenAI's shape
with `Retry-After` (the openai client raises RateLimitError and retries after it).

- requests per second: a token bucket holding at most one second's worth (burst = max(1, rps));
- tokens per minute: what the admitted requests of the last 60 s may use, charged at admission with
  an estimate (prompt characters / 4 + max_tokens) and corrected to the real prompt + completion
  tokens when the answer comes (an answer shorter than max_tokens gives the rest back);
- requests in flight: admitted and not yet answered.

Across gateway replicas (services/gateway/limit_sync.py): each replica reports what it admitted per
tenant every ~100 ms; every replica charges the others' admissions to the same buckets and windows and
counts their in-flight requests. How exact: a replica sees the others' admissions one report later, so
N replicas admitting at once can together pass a limit by what they admit in one report interval
(at most one burst each for requests per second); over any longer window the limits hold.

Hand-written: a few counters per tenant; no library models this.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from libs.contracts import MAX_LIMIT_RPS, TenantLimits
from services.gateway.errors import GatewayError

WINDOW_S = 60.0


@dataclass
class _Charge:
    at: float
    tokens: int


@dataclass
class _Remote:
    in_flight: int
    at: float


@dataclass
class _TenantState:
    bucket: float = 0.0
    refilled_at: float = 0.0
    in_flight: int = 0
    charges: deque[_Charge] = field(default_factory=deque)
    remote: dict[str, _Remote] = field(default_factory=dict)  # other gateway -> its in-flight requests
    bucket_known: bool = True  # false: only other replicas' admissions are charged so far (from a full bucket)
    rps: float | None = None  # the requests-per-second limit at the last admission here (None: none)

    def remote_in_flight(self, now: float, stale_s: float) -> int:
        for gateway in [g for g, r in self.remote.items() if now - r.at > stale_s]:
            del self.remote[gateway]  # that gateway stopped reporting (gone): its count is void
        return sum(r.in_flight for r in self.remote.values())

    def tokens_in_window(self, now: float) -> int:
        while self.charges and now - self.charges[0].at >= WINDOW_S:
            self.charges.popleft()
        return sum(charge.tokens for charge in self.charges)


@dataclass
class Admitted:
    """What this gateway admitted for one tenant since its last report to the other replicas."""

    requests: int = 0
    tokens: int = 0


class RateLimited(GatewayError):
    """429: over a tenant's limit. `retryable`: false when the request can never fit (bigger than the
    tokens-per-minute limit), so waiting for the limit is pointless."""

    def __init__(self, message: str, retry_after_s: float, retryable: bool = True) -> None:
        seconds = max(1, math.ceil(retry_after_s))
        super().__init__(429, message, "rate_limit_exceeded", headers={"Retry-After": str(seconds)})
        self.retry_after_s = retry_after_s
        self.retryable = retryable


@dataclass
class Ticket:
    """One admitted request; `release` it exactly once when it is answered (or fails)."""

    tenant: str
    charge: _Charge | None
    estimated_tokens: int = 0
    released: bool = False


class TenantLimiter:
    def __init__(
        self,
        defaults: TenantLimits,
        clock: Callable[[], float] = time.monotonic,
        on_throttle: Callable[[str, str], None] | None = None,
    ) -> None:
        self.defaults = defaults
        self._clock = clock
        self._tenants: dict[str, _TenantState] = {}
        self._on_throttle = on_throttle or (lambda tenant, limit: None)
        self.admitted: dict[str, Admitted] = {}  # since the last report to the other replicas
        self.remote_stale_s = 3.0
        self._reported_busy: set[str] = set()

    def effective(self, limits: TenantLimits | None) -> TenantLimits:
        own = limits or TenantLimits()
        return TenantLimits(
            rps=own.rps or self.defaults.rps,
            tpm=own.tpm or self.defaults.tpm,
            concurrency=own.concurrency or self.defaults.concurrency,
        )

    def admit(self, tenant: str, limits: TenantLimits | None, estimated_tokens: int) -> Ticket:
        """A ticket, or GatewayError 429 naming the limit and when to retry. Nothing is counted for a
        refused request."""
        lim = self.effective(limits)
        now = self._clock()
        burst = max(1.0, lim.rps or 1.0)
        state = self._tenants.setdefault(tenant, _TenantState(bucket=burst, refilled_at=now))
        if not state.bucket_known:
            state.bucket, state.bucket_known = burst + state.bucket, True
        state.rps = lim.rps
        if lim.concurrency is not None and state.in_flight + state.remote_in_flight(now, self.remote_stale_s) >= (
            lim.concurrency
        ):
            self._refuse(tenant, "concurrency", f"{lim.concurrency} requests in flight", 1.0)
        if lim.rps is not None:
            state.bucket = min(burst, state.bucket + (now - state.refilled_at) * lim.rps)
            state.refilled_at = now
            if state.bucket < 1.0:
                self._refuse(tenant, "rps", f"{lim.rps:g} requests per second", (1.0 - state.bucket) / lim.rps)
        charge = None
        if lim.tpm is not None:
            used = state.tokens_in_window(now)
            if estimated_tokens > lim.tpm:
                self._refuse(
                    tenant,
                    "tpm",
                    f"{lim.tpm} tokens per minute (this request may use {estimated_tokens}; lower max_tokens)",
                    WINDOW_S,
                    retryable=False,
                )
            if used + estimated_tokens > lim.tpm:
                self._refuse(
                    tenant, "tpm", f"{lim.tpm} tokens per minute", self._tpm_wait(state, lim.tpm, now, estimated_tokens)
                )
            charge = _Charge(now, estimated_tokens)
            state.charges.append(charge)
        if lim.rps is not None:
            state.bucket -= 1.0
        state.in_flight += 1
        mine = self.admitted.setdefault(tenant, Admitted())
        mine.requests += 1
        mine.tokens += charge.tokens if charge is not None else estimated_tokens
        return Ticket(tenant, charge, estimated_tokens)

    def release(self, ticket: Ticket, used_tokens: int | None = None) -> None:
        """The request is over: it leaves the in-flight count; its token charge becomes what it really
        used (None: keep the estimate, e.g. the answer never came)."""
        if ticket.released:
            return
        ticket.released = True
        state = self._tenants.get(ticket.tenant)
        if state is None:
            return
        state.in_flight = max(0, state.in_flight - 1)
        if used_tokens is not None:
            if ticket.charge is not None:
                ticket.charge.tokens = used_tokens
            self.admitted.setdefault(ticket.tenant, Admitted()).tokens += used_tokens - ticket.estimated_tokens

    # --- the other gateway replicas ------------------------------------------------------------------
    def take_report(self) -> dict[str, tuple[int, int, int]]:
        """tenant -> (requests, tokens, in flight) to tell the other replicas; every tenant admitted
        since the last report or with requests in flight. Resets what was admitted."""
        busy = {tenant for tenant, state in self._tenants.items() if state.in_flight}
        report = {}
        # A tenant reported busy last time is reported again once idle: the others drop its count now.
        for tenant in set(self.admitted) | busy | self._reported_busy:
            admitted = self.admitted.get(tenant, Admitted())
            report[tenant] = (admitted.requests, admitted.tokens, self.in_flight(tenant))
        self._reported_busy = busy
        self.admitted = {}
        return report

    def charge_remote(self, gateway: str, tenant: str, requests: int, tokens: int, in_flight: int) -> None:
        """Another replica admitted `requests` using `tokens` for `tenant` and has `in_flight` of its
        requests running: the same buckets and windows as this replica's own."""
        now = self._clock()
        # First heard of here: the bucket starts full at this replica's first admission, less this.
        state = self._tenants.setdefault(tenant, _TenantState(bucket=0.0, refilled_at=now, bucket_known=False))
        if state.rps is not None or not state.bucket_known:
            # Debt of at most one second's worth: what several replicas can overshoot together, never
            # a backlog that would refuse the tenant long after (nor one built while it had no limit).
            floor = -max(1.0, state.rps or 1.0) if state.bucket_known else -MAX_LIMIT_RPS
            state.bucket = max(floor, state.bucket - requests)
        if tokens:
            state.charges.append(_Charge(now, tokens))
        state.remote[gateway] = _Remote(in_flight, now)

    def in_flight(self, tenant: str) -> int:
        state = self._tenants.get(tenant)
        return state.in_flight if state else 0

    def others_in_flight(self, tenant: str) -> int:
        """The tenant's requests in flight at the other replicas, as last reported."""
        state = self._tenants.get(tenant)
        return state.remote_in_flight(self._clock(), self.remote_stale_s) if state else 0

    @staticmethod
    def _tpm_wait(state: _TenantState, tpm: int, now: float, needed: int) -> float:
        """Seconds until enough of the window's charges expire for `needed` more tokens."""
        over = sum(c.tokens for c in state.charges) + needed - tpm
        for charge in state.charges:
            over -= charge.tokens
            if over <= 0:
                return max(0.0, WINDOW_S - (now - charge.at))
        return WINDOW_S

    def _refuse(self, tenant: str, limit: str, what: str, retry_after_s: float, retryable: bool = True) -> None:
        self._on_throttle(tenant, limit)
        seconds = max(1, math.ceil(retry_after_s))
        message = f"Rate limit reached for tenant {tenant!r}: {what}. Retry after {seconds} s."
        raise RateLimited(message, retry_after_s, retryable)


def estimate_tokens(prompt_chars: int, max_tokens: int) -> int:
    """A request's token use before it runs: about 4 characters per prompt token, plus max_tokens."""
    return math.ceil(prompt_chars / 4) + max_tokens
