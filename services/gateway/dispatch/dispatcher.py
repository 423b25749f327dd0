"""The Dispatcher: the one object the rest of the gateway dispatches through.

For each accepted request: pick the pool (base model, rank), admit it (overload refusal, fair queue:
admission.py), route it on the adapter digest ('base' for base-model requests) over the pool's live
workers (routing.py), count it (ledger.py), publish the InferenceRequest to
`subjects.infer(pool, worker, token)` (publishing.py), and wait for the worker's InferenceResult
(delivery.py) or stream its tokens (reassembly.py). This module only wires those parts together.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from opentelemetry import trace

from libs.contracts import AdapterRef, InferenceRequest, InferenceResult, TokenDelta, subjects
from libs.routing import RouteDecision
from services.gateway import errors
from services.gateway.dispatch import reassembly
from services.gateway.dispatch.admission import Admission
from services.gateway.dispatch.delivery import Delivery
from services.gateway.dispatch.job import BASE_TOKEN, DeltaQueue, Job
from services.gateway.dispatch.ledger import InFlight
from services.gateway.dispatch.publishing import Publisher
from services.gateway.dispatch.routing import Routing
from services.gateway.dispatch.settings import DispatchSettings
from services.gateway.fairness import FairQueue
from services.gateway.metrics import GatewayMetrics
from services.gateway.overload import OverloadGuard
from services.gateway.pool_view import NoPoolError, PoolView

log = logging.getLogger(__name__)


class Dispatcher:
    def __init__(
        self,
        nc,
        js,
        pools: PoolView,
        metrics: GatewayMetrics,
        settings: DispatchSettings | None = None,
        *,
        tracer: trace.Tracer | None = None,
    ) -> None:
        settings = settings or DispatchSettings()
        self.nc, self.js = nc, js
        self.pools = pools
        self.metrics = metrics
        self.settings = settings
        self.gateway_id = settings.delivery.gateway_id
        self.tracer = tracer or trace.get_tracer("loraplex.gateway")
        self.ledger = InFlight(metrics)
        self.routing = Routing(settings.routing, pools, self.ledger)
        self.admission = Admission(
            settings.admission, metrics, self.routing.pool_room, self.ledger.tenant_loads.__getitem__
        )
        self.delivery = Delivery(nc, js, settings.delivery, metrics, self.ledger, self.admission, self._release)
        # Told of every routed adapter request (the gateway counts demand for placement).
        self.on_routed: Callable[[str, AdapterRef], None] | None = None
        self.publisher = Publisher(
            js, self.tracer, gateway_id=settings.delivery.gateway_id, retry_s=settings.delivery.publish_retry_s
        )

    # --- what the parts hold, as the gateway, the re-router and the tests read it ---------------------
    @property
    def jobs(self) -> dict[str, Job]:
        return self.ledger.jobs

    @property
    def loads(self) -> dict[str, int]:
        return self.ledger.loads

    @property
    def adapter_loads(self) -> dict[str, dict[str, int]]:
        return self.ledger.adapter_loads

    @property
    def fair(self) -> FairQueue | None:
        return self.admission.fair

    @property
    def overload(self) -> OverloadGuard | None:
        return self.admission.overload

    @property
    def routing_policy(self) -> str:
        return self.routing.policy

    @routing_policy.setter
    def routing_policy(self, policy: str) -> None:
        self.routing.policy = policy

    @property
    def _answered(self):
        return self.delivery.answered

    # --- lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.delivery.start()

    async def stop(self) -> None:
        await self.delivery.stop()
        for job in list(self.jobs.values()):
            if not job.future.done():
                job.future.set_exception(errors.unavailable("the gateway is shutting down"))
            self._release(job)

    # --- submitting ----------------------------------------------------------------------------------
    async def submit(
        self,
        request: InferenceRequest,
        *,
        rank: int | None,
        stream: bool = False,
        interactive: bool = True,
        refuse_early: bool | None = None,
        after_wait: Callable[[], Awaitable[object]] | None = None,
        fresh: bool = False,
    ) -> Job:
        """Route and publish one request; GatewayError 503 when no worker can take it, or (with
        `refuse_early`, default: interactive requests) when it could not finish before its deadline.
        While the pool is full it waits for its fair share (interactive before batch); after a wait,
        `after_wait` may still refuse it (a key revoked meanwhile). `fresh`: a request id this gateway
        minted for this request, never dispatched before (the worker may skip its duplicate lookup)."""
        if request.request_id in self.jobs:
            raise errors.bad_request(
                f"request id {request.request_id!r} is already in flight", "request_id", "duplicate_request"
            )
        choice = self._select(request, rank)
        refuse_early = interactive if refuse_early is None else refuse_early
        if refuse_early and request.deadline is not None:
            self.admission.check_overload(choice.pool, request.tenant_id, request.deadline)
        granted = choice.pool
        waited = await self.admission.acquire(granted, request.tenant_id, interactive, request.deadline)
        try:
            if waited and after_wait is not None:
                await after_wait()
            if self.fair is not None:
                choice = self._select(request, rank)  # workers may have come or gone while it waited
            job = self._assign(request, choice, stream, interactive)
        finally:
            self.admission.dispatched(granted)  # in the load signal now (or failed): no longer pending
        try:
            job.publish_started_at = time.time()
            subject = subjects.infer(job.pool, job.worker, job.token)
            await self.publish(job, subject, self._msg_id(request.request_id), fresh=fresh)
            job.published_at = time.time()
        except Exception as exc:
            self._release(job)
            log.error("publish failed", extra={"request_id": request.request_id, "error": repr(exc)})
            raise errors.unavailable(f"could not queue the request: {type(exc).__name__}", "queue_unavailable") from exc
        self.metrics.routing.add(
            1, {"pool": job.pool, "affinity_hit": job.decision.affinity_hit, "spilled": job.decision.spilled}
        )
        return job

    def _select(self, request: InferenceRequest, rank: int | None):
        try:
            return self.pools.select(request.base_model, rank)
        except NoPoolError as exc:
            raise errors.unavailable(str(exc), "no_worker_available") from None

    def _assign(self, request: InferenceRequest, choice, stream: bool, interactive: bool = False) -> Job:
        """Route (on the loads of now, after any wait) and count the job against its worker."""
        token = request.adapter.digest if request.adapter else BASE_TOKEN
        decision = self.route(choice.pool, choice.workers, token)
        if request.adapter is not None and self.on_routed is not None:
            self.on_routed(choice.pool, request.adapter)
        if interactive and self.fair is not None:
            decision = self.routing.spill_if_full(choice.workers, decision)
        job = Job(
            request=request,
            pool=choice.pool,
            token=token,
            expected_digest=request.adapter.digest if request.adapter else None,
            worker=decision.worker,
            future=asyncio.get_running_loop().create_future(),
            deltas=DeltaQueue() if stream else None,
            decision=decision,
        )
        self.ledger.track(job)
        return job

    def _msg_id(self, request_id: str) -> str:
        return self.publisher.msg_id(request_id)

    async def publish(self, job: Job, subject: str, msg_id: str, *, fresh: bool = False) -> None:
        await self.publisher.publish(job, subject, msg_id, fresh=fresh)

    # --- routing and load (the re-router routes and moves jobs too) ------------------------------------
    def route(self, pool: str, workers: tuple[str, ...], token: str) -> RouteDecision:
        return self.routing.route(pool, workers, token)

    def worker_loads(self, workers: tuple[str, ...]) -> dict[str, int]:
        return self.routing.worker_loads(workers)

    def pool_room(self, pool: str) -> tuple[int, int]:
        return self.routing.pool_room(pool)

    def move(self, job: Job, worker: str) -> None:
        """Re-assign a job's load to another worker (re-routing)."""
        self.ledger.move(job, worker)

    def _release(self, job: Job, at: float | None = None) -> None:
        if self.ledger.release(job, at):
            self.admission.released(job.pool)  # a place is free: the next tenant in turn goes

    # --- results -------------------------------------------------------------------------------------
    async def _on_result(self, msg) -> None:
        await self.delivery.on_result(msg)

    async def _on_token(self, msg) -> None:
        await self.delivery.on_token(msg)

    async def _on_load(self, msg) -> None:
        await self.delivery.on_load(msg)

    async def catch_up(self, older_than_s: float = 0.0) -> int:
        """Deliver results already stored for requests in flight (missed while disconnected)."""
        return await self.delivery.catch_up(older_than_s)

    def abandon(self, job: Job) -> None:
        """The caller gave up (deadline or disconnect): stop tracking; a later result is dropped."""
        self.delivery.abandon(job)

    async def wait(self, job: Job, deadline: float) -> InferenceResult:
        """The checked result, or GatewayError (504 at the deadline, worker errors, digest mismatch)."""
        return await self.delivery.wait(job, deadline)

    def events(self, job: Job, deadline: float) -> AsyncIterator[TokenDelta | InferenceResult]:
        """Streaming: deltas in order, then the checked final result (reassembly.py)."""
        return reassembly.events(job, deadline, self.abandon, self.metrics)
