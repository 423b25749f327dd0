"""Tenant limits across gateway replicas: each replica tells the others what it admitted.

Every `interval_s` (100 ms by default) a replica publishes a LimitReport (core NATS, not stored) with
what it admitted per tenant since its last report (requests, tokens) and its requests in flight; every
other replica charges that to the same tenant's bucket, token window and in-flight count
(`TenantLimiter.charge_remote`). A replica that stops reporting (gone) has its in-flight counts
dropped after `TenantLimiter.remote_stale_s`.

How exact: a replica sees the others' admissions one interval (+ transit) late, so while N replicas
admit at the same moment a tenant can pass its limit by what the replicas admit in one interval (at
most one burst each for requests per second); over longer windows the limits hold. The same lag the
other way: a place freed at one replica is seen free by the others a report later (measured here up to
~0.3 s with busy event loops), so a tenant at its concurrency limit can be refused that long for nothing.
While the broker is away each replica counts alone (its own share up to the whole limit): limits fail
open, never shut.

Hand-written rather than a NATS KV counter per request: a compare-and-set round trip on every request's
path, contended by every replica for a busy tenant, for exactness nobody needs at one-second windows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from pydantic import ValidationError

from libs.contracts import LimitReport, TenantUsageDelta, subjects
from services.gateway.limits import TenantLimiter

log = logging.getLogger(__name__)


class LimitSync:
    def __init__(self, nc, limiter: TenantLimiter, gateway_id: str, *, interval_s: float = 0.1) -> None:
        self.nc = nc
        self.limiter = limiter
        self.gateway_id = gateway_id
        self.interval_s = interval_s
        self.reports_received = 0
        self._sub = None
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(subjects.GATEWAY_LIMITS_ALL, cb=self._on_report)
        self._task = asyncio.create_task(self._publish_loop(), name="limit-sync")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    async def publish_once(self) -> bool:
        """Report what was admitted since the last report; false when there was nothing to say."""
        taken = self.limiter.take_report()
        if not taken:
            return False
        tenants = {t: TenantUsageDelta(requests=r, tokens=k, in_flight=n) for t, (r, k, n) in taken.items()}
        report = LimitReport(gateway_id=self.gateway_id, tenants=tenants)
        try:
            await self.nc.publish(subjects.gateway_limits(self.gateway_id), report.model_dump_json().encode())
        except Exception as exc:
            log.debug("limit report not sent: %s", type(exc).__name__)
        return True

    async def _publish_loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.publish_once()

    async def _on_report(self, msg) -> None:
        try:
            report = LimitReport.model_validate_json(msg.data)
        except ValidationError:
            log.warning("ignoring an unreadable limit report on %s", msg.subject)
            return
        if report.gateway_id == self.gateway_id:
            return
        self.reports_received += 1
        for tenant, delta in report.tenants.items():
            self.limiter.charge_remote(report.gateway_id, tenant, delta.requests, delta.tokens, delta.in_flight)
