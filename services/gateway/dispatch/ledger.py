"""Load accounting: what this gateway has in flight, per worker, per adapter and per tenant.

The routing signal (with the workers' heartbeats, `FleetLoad`) and the fair queue's "held" counts are
read from here; every job is counted once when assigned and released once (first result, deadline,
abandon or shutdown)."""

from __future__ import annotations

from collections import Counter, defaultdict

from services.gateway.dispatch.job import Job
from services.gateway.fleet_load import FleetLoad
from services.gateway.metrics import GatewayMetrics


class InFlight:
    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics
        self.jobs: dict[str, Job] = {}
        self.loads: dict[str, int] = defaultdict(int)  # worker -> this gateway's in-flight requests
        self.adapter_loads: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))  # pool -> token -> n
        self.tenant_loads: dict[str, Counter[str]] = defaultdict(Counter)  # pool -> tenant -> in flight here
        self.fleet = FleetLoad()

    def track(self, job: Job) -> None:
        self.jobs[job.request_id] = job
        self.loads[job.worker] += 1
        self.fleet.sent(job.worker)
        self.adapter_loads[job.pool][job.token] += 1
        self.tenant_loads[job.pool][job.request.tenant_id] += 1
        self.metrics.in_flight.add(1)

    def release(self, job: Job, at: float | None = None) -> bool:
        """Stop counting a job (`at`: when its worker stopped counting it, see FleetLoad.answered); false
        when it was no longer counted."""
        if self.jobs.pop(job.request_id, None) is None:
            return False
        self.unload(job.worker, at)
        per_pool = self.adapter_loads[job.pool]
        per_pool[job.token] -= 1
        if per_pool[job.token] <= 0:
            del per_pool[job.token]
        per_tenant = self.tenant_loads[job.pool]
        per_tenant[job.request.tenant_id] -= 1
        if per_tenant[job.request.tenant_id] <= 0:
            del per_tenant[job.request.tenant_id]
        self.metrics.in_flight.add(-1)
        return True

    def unload(self, worker: str, at: float | None = None) -> None:
        self.fleet.answered(worker, at)
        self.loads[worker] -= 1
        if self.loads[worker] <= 0:
            del self.loads[worker]

    def move(self, job: Job, worker: str) -> None:
        """Re-assign a job's load to another worker (re-routing)."""
        self.unload(job.worker)
        job.worker = worker
        self.loads[worker] += 1
        self.fleet.sent(worker)
