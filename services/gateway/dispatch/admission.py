"""Admission: whether and when an accepted request goes on to a worker.

* Overload refusal: an interactive request the pool cannot finish before its deadline (the queue
  ahead of it and the measured time per request, services/gateway/overload.py) is refused at once
  with 503 + Retry-After instead of 504 after the whole deadline.
* Fair queuing: once a pool is full, requests wait here per tenant and go on by weighted fair share,
  interactive before batch (services/gateway/fairness.py). Without it (fair_headroom None) they go
  on in arrival order and queue on the workers."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from services.gateway.dispatch.settings import AdmissionSettings
from services.gateway.errors import GatewayError
from services.gateway.fairness import BATCH, INTERACTIVE, FairQueue
from services.gateway.metrics import GatewayMetrics
from services.gateway.overload import OverloadGuard


class Admission:
    def __init__(
        self,
        settings: AdmissionSettings,
        metrics: GatewayMetrics,
        room: Callable[[str], tuple[int, int]],
        held: Callable[[str], Mapping[str, int]],
    ) -> None:
        """`room(pool)` -> (load, capacity) of the pool now; `held(pool)` -> tenant -> in flight here."""
        self.metrics = metrics
        self._room = room
        self.fair: FairQueue | None = None
        if settings.fair_headroom:
            self.fair = FairQueue(
                room, headroom=settings.fair_headroom, batch_reserve=settings.batch_reserve, held=held
            )
        self.overload: OverloadGuard | None = None
        if settings.overload_margin is not None:
            self.overload = OverloadGuard(margin=settings.overload_margin)

    def check_overload(self, pool: str, tenant: str, deadline: float) -> None:
        """503 when the request would miss its deadline behind the work already ahead of it."""
        if self.overload is None:
            return
        load, capacity = self._room(pool)
        if capacity <= 0:
            return
        ahead = self.fair.ahead(pool, tenant) if self.fair is not None else 0
        try:
            self.overload.check(pool, pool, load + ahead, capacity, deadline - time.time())
        except GatewayError:
            self.metrics.overload_refusals.add(1, {"pool": pool})
            raise

    async def acquire(self, pool: str, tenant: str, interactive: bool, deadline: float | None) -> bool:
        """Returns when the request may go on (true: after a wait in a full pool); 504 at its deadline."""
        if self.fair is None:
            return False
        return await self.fair.acquire(pool, tenant, INTERACTIVE if interactive else BATCH, deadline)

    def dispatched(self, pool: str) -> None:
        """A granted request is in the load signal now (or failed): no longer pending."""
        if self.fair is not None:
            self.fair.dispatched(pool)

    def released(self, pool: str | None = None) -> None:
        """A place is free (here, or another gateway's request finished): the next in turn goes."""
        if self.fair is not None:
            self.fair.kick(pool)

    def observe(self, pool: str, service_s: float) -> None:
        """One finished request's time on its worker (the overload estimate)."""
        if self.overload is not None:
            self.overload.observe(pool, service_s)
