"""Refuse early what the pool cannot finish in time, instead of accepting it and answering 504 after
the whole deadline.

Per pool the gateway keeps a moving average of how long a request takes once a worker runs it (the
worker's `total_s`, measured on every result). A new request routed to a worker with `load` requests
ahead of it (in flight + queued, the routing signal) and `capacity` slots waits about
`load - capacity + 1` slots' worth of turns: its expected finish is
`service_s * (1 + max(0, load + 1 - capacity) / capacity)`. When that exceeds the time left before the
request's deadline (times `margin`), the gateway answers 503 with Retry-After at once. Never before
`min_samples` results have been measured in the pool: no refusal on a guess.

Hand-written: one moving average and one comparison per request.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from services.gateway.errors import GatewayError


@dataclass
class _Average:
    value: float = 0.0
    samples: int = 0


class OverloadGuard:
    def __init__(self, *, alpha: float = 0.2, min_samples: int = 5, margin: float = 1.0) -> None:
        self.alpha = alpha
        self.min_samples = min_samples
        self.margin = margin
        self._service: dict[str, _Average] = defaultdict(_Average)

    def observe(self, pool: str, service_s: float) -> None:
        """One finished request's time on its worker."""
        if service_s <= 0:
            return
        avg = self._service[pool]
        avg.value = service_s if avg.samples == 0 else (1 - self.alpha) * avg.value + self.alpha * service_s
        avg.samples += 1

    def service_s(self, pool: str) -> float | None:
        avg = self._service.get(pool)
        return avg.value if avg and avg.samples >= self.min_samples else None

    def expected_finish_s(self, pool: str, load: int, capacity: int) -> float | None:
        service = self.service_s(pool)
        if service is None:
            return None
        capacity = max(1, capacity)
        return service * (1 + max(0, load + 1 - capacity) / capacity)

    def check(self, pool: str, worker: str, load: int, capacity: int, time_left_s: float) -> None:
        """GatewayError 503 with Retry-After when the request would miss its deadline on `worker`."""
        expected = self.expected_finish_s(pool, load, capacity)
        if expected is None or expected <= time_left_s * self.margin:
            return
        retry = min(300, max(1, math.ceil(expected - time_left_s)))
        raise GatewayError(
            503,
            f"The pool {pool} is overloaded: about {expected:.0f} s of work is queued ahead of this request on "
            f"{worker}, more than its {time_left_s:.0f} s deadline. Retry after {retry} s.",
            "pool_overloaded",
            headers={"Retry-After": str(retry)},
        )
