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

Counted per gateway replica (hand-written: a few counters per tenant; no library models this): with
N replicas behind a balancer a tenant can get up to N times its limits.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from libs.contracts import TenantLimits
from services.gateway.errors import GatewayError

WINDOW_S = 60.0


@dataclass
class _Charge:
    at: float
    tokens: int


@dataclass
class _TenantState:
    bucket: float = 0.0
    refilled_at: float = 0.0
    in_flight: int = 0
    charges: deque[_Charge] = field(default_factory=deque)

    def tokens_in_window(self, now: float) -> int:
        while self.charges and now - self.charges[0].at >= WINDOW_S:
            self.charges.popleft()
        return sum(charge.tokens for charge in self.charges)


@dataclass
class Ticket:
    """One admitted request; `release` it exactly once when it is answered (or fails)."""

    tenant: str
    charge: _Charge | None
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
        state = self._tenants.setdefault(tenant, _TenantState(bucket=max(1.0, lim.rps or 1.0), refilled_at=now))
        if lim.concurrency is not None and state.in_flight >= lim.concurrency:
            self._refuse(tenant, "concurrency", f"{lim.concurrency} requests in flight", 1.0)
        if lim.rps is not None:
            state.bucket = min(max(1.0, lim.rps), state.bucket + (now - state.refilled_at) * lim.rps)
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
        return Ticket(tenant, charge)

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
        if ticket.charge is not None and used_tokens is not None:
            ticket.charge.tokens = used_tokens

    def in_flight(self, tenant: str) -> int:
        state = self._tenants.get(tenant)
        return state.in_flight if state else 0

    @staticmethod
    def _tpm_wait(state: _TenantState, tpm: int, now: float, needed: int) -> float:
        """Seconds until enough of the window's charges expire for `needed` more tokens."""
        over = sum(c.tokens for c in state.charges) + needed - tpm
        for charge in state.charges:
            over -= charge.tokens
            if over <= 0:
                return max(0.0, WINDOW_S - (now - charge.at))
        return WINDOW_S

    def _refuse(self, tenant: str, limit: str, what: str, retry_after_s: float) -> None:
        self._on_throttle(tenant, limit)
        seconds = max(1, math.ceil(retry_after_s))
        raise GatewayError(
            429,
            f"Rate limit reached for tenant {tenant!r}: {what}. Retry after {seconds} s.",
            "rate_limit_exceeded",
            headers={"Retry-After": str(seconds)},
        )


def estimate_tokens(prompt_chars: int, max_tokens: int) -> int:
    """A request's token use before it runs: about 4 characters per prompt token, plus max_tokens."""
    return math.ceil(prompt_chars / 4) + max_tokens
