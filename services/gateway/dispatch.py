"""Routed work out, results and tokens back.

For each accepted request: pick the pool (base model, rank), route on the adapter digest ('base' for
base-model requests) with `libs.routing.BoundedLoadRouter` over the pool's live workers and the
gateway's own in-flight counts, publish the InferenceRequest to `subjects.infer(pool, worker, token)`
(JetStream, Nats-Msg-Id = request id, trace context in the headers), and wait for the worker's
InferenceResult on `subjects.results(rid)`. The first result per request id wins; later ones (after a
re-route) are dropped and counted. A result whose applied digest differs from the resolved one is an
error to the caller and a counted alert, never a silent success.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from nats.js.errors import NotFoundError
from opentelemetry import context as otel_context
from opentelemetry import trace
from pydantic import ValidationError

from libs.bus.recent_ids import RecentIds
from libs.bus.retry import publish_retrying
from libs.bus.state import ConnectionState
from libs.contracts import AdapterRef, InferenceRequest, InferenceResult, TokenDelta, WorkerLoad, subjects
from libs.routing import BoundedLoadRouter, RouteDecision, make_policy
from libs.telemetry import inject_headers
from services.gateway import errors
from services.gateway.errors import GatewayError
from services.gateway.fairness import BATCH, INTERACTIVE, FairQueue
from services.gateway.fleet_load import FleetLoad
from services.gateway.metrics import GatewayMetrics
from services.gateway.overload import OverloadGuard
from services.gateway.pool_view import NoPoolError, PoolView

log = logging.getLogger(__name__)
BASE_TOKEN = "base"


@dataclass
class Job:
    """One accepted request, until its first result (or its deadline)."""

    request: InferenceRequest
    pool: str
    token: str  # adapter digest, or 'base'
    expected_digest: str | None
    worker: str  # current assignment; subjects.ANY_WORKER when handed to the whole pool
    future: asyncio.Future
    deltas: asyncio.Queue | None = None
    attempts: int = 1
    rerouted: bool = False
    accepted_at: float = field(default_factory=time.monotonic)
    # Stage timeline stamps (unix seconds; see services.gateway.timeline).
    publish_started_at: float | None = None
    published_at: float | None = None
    received_at: float | None = None
    decision: RouteDecision | None = None
    # The caller's trace: a re-route after a worker dies publishes in the same trace, not a new one.
    trace_context: otel_context.Context = field(default_factory=otel_context.get_current)

    @property
    def request_id(self) -> str:
        return self.request.request_id


@dataclass
class _LoadView:
    """What the baseline policies (random, least_loaded, consistent_hash) observe: the workers' loads."""

    loads: dict[str, int]
    adapter_loads: dict[str, int] = field(default_factory=dict)
    max_active_adapters: int = 0
    max_running: int = 0

    @property
    def total_load(self) -> int:
        return sum(self.loads.values())

    def queued(self, worker: str) -> int:
        return 0

    def running(self, worker: str) -> int:
        return self.loads.get(worker, 0)


class DigestMismatch(GatewayError):
    def __init__(self, expected: str | None, applied: str | None, worker: str) -> None:
        super().__init__(
            502,
            f"worker {worker} applied adapter {_short(applied)} but {_short(expected)} was "
            f"resolved; the answer was withheld",
            "adapter_digest_mismatch",
        )
        self.expected, self.applied, self.worker = expected, applied, worker


def _short(digest: str | None) -> str:
    return digest[:12] if digest else "none (base model)"


def check_result(job: Job, result: InferenceResult, metrics: GatewayMetrics | None = None) -> InferenceResult:
    """The result if it is a success with exactly the resolved adapter applied; GatewayError otherwise."""
    return check_applied(result, job.expected_digest, tenant=job.request.tenant_id, pool=job.pool, metrics=metrics)


def check_applied(
    result: InferenceResult,
    expected_digest: str | None,
    *,
    tenant: str,
    pool: str = "",
    metrics: GatewayMetrics | None = None,
) -> InferenceResult:
    if not result.ok:
        err = result.error
        raise errors.from_worker(err.code if err else "engine_error", err.message if err else "worker error")
    if result.adapter_digest_applied != expected_digest:
        if metrics is not None:
            metrics.digest_mismatch.add(1, {"tenant": tenant, "pool": pool, "worker": result.worker_id})
        log.error(
            "digest mismatch: answer withheld",
            extra={
                "request_id": result.request_id,
                "worker": result.worker_id,
                "expected": expected_digest,
                "applied": result.adapter_digest_applied,
            },
        )
        raise DigestMismatch(expected_digest, result.adapter_digest_applied, result.worker_id)
    return result


class Dispatcher:
    def __init__(
        self,
        nc,
        js,
        pools: PoolView,
        metrics: GatewayMetrics,
        *,
        balance_factor: float = 1.25,
        hot_threshold: int = 8,
        max_spread: int = 16,
        publish_retry_s: float = 30.0,
        catch_up_every_s: float = 5.0,
        tracer: trace.Tracer | None = None,
        gateway_id: str | None = None,
        load_signal: str = "fleet",
        routing_policy: str = "bounded_load",
        overload: OverloadGuard | None = None,
        fair_headroom: float | None = 1.25,
        batch_reserve: float = 0.0,
    ) -> None:
        self.nc, self.js = nc, js
        # Once a pool is full, requests wait per tenant and go on by fair share (None: FIFO into the pool).
        self.fair = None
        self.tenant_loads: dict[str, Counter[str]] = defaultdict(Counter)  # pool -> tenant -> in flight here
        if fair_headroom:
            self.fair = FairQueue(
                self.pool_room, headroom=fair_headroom, batch_reserve=batch_reserve, held=self.tenant_loads.__getitem__
            )
        # Interactive requests the pool cannot finish before their deadline are refused at once (None: never).
        self.overload = overload
        # Told of every routed adapter request (the gateway counts demand for placement).
        self.on_routed: Callable[[str, AdapterRef], None] | None = None
        # Results and tokens come to this gateway's own subjects (None: the shared ones, every result).
        self.gateway_id = gateway_id
        self.load_signal = load_signal  # "fleet": heartbeats + own deltas; "local": this gateway's own counts
        self.fleet = FleetLoad()
        # "bounded_load" (loraplex's router) everywhere; the others are baselines for the fleet benchmark.
        self.routing_policy = routing_policy
        self._policies: dict[tuple[str, str], tuple[tuple[str, ...], object]] = {}
        self.publish_retry_s = publish_retry_s
        self.catch_up_every_s = catch_up_every_s
        self.pools = pools
        self.metrics = metrics
        self.tracer = tracer or trace.get_tracer("loraplex.gateway")
        self._router_args = dict(c=balance_factor, hot_threshold=hot_threshold, max_spread=max_spread)
        self._routers: dict[str, tuple[tuple[str, ...], BoundedLoadRouter]] = {}
        self.jobs: dict[str, Job] = {}
        self.loads: dict[str, int] = defaultdict(int)  # worker -> this gateway's in-flight requests
        self.adapter_loads: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))  # pool -> token -> n
        self._answered = RecentIds(limit=100_000)
        self._subs: list = []
        self._sweeper: asyncio.Task | None = None
        self._lookups = ConnectionState("results stream lookups")

    async def start(self) -> None:
        results, tokens = subjects.RESULTS_ALL, subjects.TOKENS_ALL
        if self.gateway_id:
            results, tokens = subjects.results_to_filter(self.gateway_id), subjects.tokens_to_filter(self.gateway_id)
        self._subs = [
            await self.nc.subscribe(results, cb=self._on_result),
            await self.nc.subscribe(tokens, cb=self._on_token),
            await self.nc.subscribe(subjects.WORKER_LOAD_ALL, cb=self._on_load),
        ]
        await self.nc.flush()
        self._sweeper = asyncio.create_task(self._sweep(), name="results-catch-up")

    async def stop(self) -> None:
        if self._sweeper:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        for job in list(self.jobs.values()):
            if not job.future.done():
                job.future.set_exception(errors.unavailable("the gateway is shutting down"))
            self._release(job)

    # --- routing -------------------------------------------------------------------------------
    def router_for(self, pool: str, workers: tuple[str, ...]) -> BoundedLoadRouter:
        known = self._routers.get(pool)
        if known is None:
            router = BoundedLoadRouter(**self._router_args, workers=workers)
            self._routers[pool] = (workers, router)
            return router
        if known[0] != workers:
            known[1].set_workers(workers)
            self._routers[pool] = (workers, known[1])
        return known[1]

    def route(self, pool: str, workers: tuple[str, ...], token: str) -> RouteDecision:
        loads = self.worker_loads(workers)
        if self.routing_policy != "bounded_load":
            return self._route_baseline(pool, workers, token, loads)
        return self.router_for(pool, workers).route(token, loads, self.adapter_loads[pool])

    def _route_baseline(self, pool: str, workers: tuple[str, ...], token: str, loads) -> RouteDecision:
        key = (pool, self.routing_policy)
        known = self._policies.get(key)
        if known is None or known[0] != workers:
            known = (workers, make_policy(self.routing_policy, workers, seed=0))
            self._policies[key] = known
        worker = known[1].choose(token, _LoadView(loads))
        return RouteDecision(worker, affinity_hit=False, spilled=False, candidates_tried=1)

    def worker_loads(self, workers: tuple[str, ...]) -> dict[str, int]:
        """The load each worker is routed by: the pool's (heartbeats + own deltas) or this gateway's."""
        if self.load_signal == "local":
            return self.loads
        return self.fleet.loads(workers, getattr(self.pools, "live", {}), self.loads)

    # --- submitting ----------------------------------------------------------------------------
    async def submit(
        self,
        request: InferenceRequest,
        *,
        rank: int | None,
        stream: bool = False,
        interactive: bool = True,
        refuse_early: bool | None = None,
        after_wait: Callable[[], Awaitable[object]] | None = None,
    ) -> Job:
        """Route and publish one request; GatewayError 503 when no worker can take it, or (with
        `refuse_early`, default: interactive requests) when it could not finish before its deadline.
        While the pool is full it waits for its fair share (interactive before batch); after a wait,
        `after_wait` may still refuse it (a key revoked meanwhile)."""
        if request.request_id in self.jobs:
            raise errors.bad_request(
                f"request id {request.request_id!r} is already in flight", "request_id", "duplicate_request"
            )
        choice = self._select(request, rank)
        refuse_early = interactive if refuse_early is None else refuse_early
        if refuse_early and self.overload is not None and request.deadline is not None:
            self._check_overload(choice.pool, request.tenant_id, request.deadline)
        granted = choice.pool
        waited = False
        if self.fair is not None:
            tier = INTERACTIVE if interactive else BATCH
            waited = await self.fair.acquire(granted, request.tenant_id, tier, request.deadline)
        try:
            if waited and after_wait is not None:
                await after_wait()
            if self.fair is not None:
                choice = self._select(request, rank)  # workers may have come or gone while it waited
            job = self._assign(request, choice, stream, interactive)
        finally:
            if self.fair is not None:
                self.fair.dispatched(granted)  # in the load signal now (or failed): no longer pending
        try:
            job.publish_started_at = time.time()
            await self.publish(job, subjects.infer(job.pool, job.worker, job.token), self._msg_id(request.request_id))
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
            decision = self._spill_if_full(choice.workers, decision)
        job = Job(
            request=request,
            pool=choice.pool,
            token=token,
            expected_digest=request.adapter.digest if request.adapter else None,
            worker=decision.worker,
            future=asyncio.get_running_loop().create_future(),
            deltas=asyncio.Queue() if stream else None,
            decision=decision,
        )
        self._track(job)
        return job

    def _spill_if_full(self, workers: tuple[str, ...], decision: RouteDecision) -> RouteDecision:
        """An interactive request whose affinity worker has every sequence busy goes to the least busy
        worker of the pool with one free, rather than queue behind that worker's work (its adapter
        loads there: a short cost next to waiting for a sequence)."""
        live = getattr(self.pools, "live", {})
        loads = self.worker_loads(workers)

        def busy(worker: str) -> float:
            capacity = live[worker].capacity if worker in live else 0
            return loads.get(worker, 0) / capacity if capacity > 0 else float("inf")

        if busy(decision.worker) < 1.0:
            return decision
        free = [w for w in workers if busy(w) < 1.0]
        if not free:
            return decision
        return RouteDecision(
            min(free, key=busy), affinity_hit=False, spilled=True, candidates_tried=decision.candidates_tried + 1
        )

    def pool_room(self, pool: str) -> tuple[int, int]:
        """(load, capacity) of a pool: in flight + queued on its live workers, and their summed capacity."""
        live = getattr(self.pools, "live", {})
        workers = tuple(w for w, beat in live.items() if beat.pool == pool)
        loads = self.worker_loads(workers)
        return sum(loads.get(w, 0) for w in workers), sum(live[w].capacity for w in workers)

    def _check_overload(self, pool: str, tenant: str, deadline: float) -> None:
        load, capacity = self.pool_room(pool)
        if capacity <= 0:
            return
        ahead = self.fair.ahead(pool, tenant) if self.fair is not None else 0
        try:
            self.overload.check(pool, pool, load + ahead, capacity, deadline - time.time())
        except GatewayError:
            self.metrics.overload_refusals.add(1, {"pool": pool})
            raise

    def _msg_id(self, request_id: str) -> str:
        """Nats-Msg-Id of a first dispatch: this gateway's retries are stored once, but another gateway
        dispatching the same request id (a submission redelivered after its first gateway died) is not
        mistaken for a duplicate and dropped by JetStream (its answer would never come)."""
        return f"{request_id}@{self.gateway_id}" if self.gateway_id else request_id

    async def publish(self, job: Job, subject: str, msg_id: str) -> None:
        with self.tracer.start_as_current_span(
            "gateway.publish",
            context=job.trace_context,
            kind=trace.SpanKind.PRODUCER,
            attributes={
                "messaging.system": "nats",
                "messaging.destination.name": subject,
                "lpx.request_id": job.request_id,
                "lpx.worker": job.worker,
                "lpx.pool": job.pool,
                "lpx.attempt": job.attempts,
            },
        ):
            headers = inject_headers({"Nats-Msg-Id": msg_id})
            give_up_at = time.time() + self.publish_retry_s
            if job.request.deadline is not None:
                give_up_at = min(give_up_at, job.request.deadline)
            await publish_retrying(
                self.js, subject, job.request.model_dump_json().encode(), headers=headers, give_up_at=give_up_at
            )

    def _track(self, job: Job) -> None:
        self.jobs[job.request_id] = job
        self.loads[job.worker] += 1
        self.fleet.sent(job.worker)
        self.adapter_loads[job.pool][job.token] += 1
        self.tenant_loads[job.pool][job.request.tenant_id] += 1
        self.metrics.in_flight.add(1)

    def _release(self, job: Job) -> None:
        if self.jobs.pop(job.request_id, None) is None:
            return
        self._unload(job.worker)
        per_pool = self.adapter_loads[job.pool]
        per_pool[job.token] -= 1
        if per_pool[job.token] <= 0:
            del per_pool[job.token]
        per_tenant = self.tenant_loads[job.pool]
        per_tenant[job.request.tenant_id] -= 1
        if per_tenant[job.request.tenant_id] <= 0:
            del per_tenant[job.request.tenant_id]
        self.metrics.in_flight.add(-1)
        if self.fair is not None:
            self.fair.kick(job.pool)  # a place is free: the next tenant in turn goes

    def _unload(self, worker: str) -> None:
        self.fleet.answered(worker)
        self.loads[worker] -= 1
        if self.loads[worker] <= 0:
            del self.loads[worker]

    def move(self, job: Job, worker: str) -> None:
        """Re-assign a job's load to another worker (re-routing)."""
        self._unload(job.worker)
        job.worker = worker
        self.loads[worker] += 1
        self.fleet.sent(worker)

    # --- results -------------------------------------------------------------------------------
    async def _on_result(self, msg) -> None:
        self._deliver(msg.data, msg.subject)

    async def catch_up(self, older_than_s: float = 0.0) -> int:
        """Deliver results already stored for requests in flight (missed while disconnected)."""
        now, found = time.monotonic(), 0
        for rid, job in list(self.jobs.items()):
            if job.future.done() or now - job.accepted_at < older_than_s:
                continue
            try:
                subject = subjects.result_lookup(rid, job.request.reply_to)
                stored = await self.js.get_last_msg(subjects.RESULTS_STREAM, subject)
            except NotFoundError:
                continue
            except Exception as exc:
                self._lookups.failed(exc)
                return found
            self._lookups.ok()
            if self._deliver(stored.data, stored.subject):
                found += 1
        if found:
            log.info("results caught up from the stream", extra={"count": found})
        return found

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.catch_up_every_s)
            if self.nc.is_connected:
                await self.catch_up(older_than_s=self.catch_up_every_s)

    def _deliver(self, data: bytes, subject: str) -> bool:
        try:
            result = InferenceResult.model_validate_json(data)
        except ValidationError:
            log.warning("ignoring an unreadable result on %s", subject)
            return False
        job = self.jobs.get(result.request_id)
        if job is None or job.future.done():
            if result.request_id in self._answered:
                self.metrics.duplicate_results.add(1)
                log.info("dropped a later result", extra={"request_id": result.request_id, "worker": result.worker_id})
            return False
        self._answered.add(result.request_id)
        job.received_at = time.time()
        # Counted here, once per request id, so that HTTP and async submissions, streamed or not, are
        # counted alike (a re-routed request's later result was dropped above).
        tenant = {"tenant": job.request.tenant_id}
        self.metrics.tokens.add(result.prompt_tokens, {**tenant, "kind": "prompt"})
        self.metrics.tokens.add(result.completion_tokens, {**tenant, "kind": "completion"})
        if self.overload is not None and result.ok:
            self.overload.observe(job.pool, result.timings.total_s)
        self._release(job)
        job.future.set_result(result)
        return True

    async def _on_load(self, msg) -> None:
        try:
            load = WorkerLoad.model_validate_json(msg.data)
        except ValidationError:
            return
        self.fleet.reported(load.worker_id, load.in_flight, load.ts)
        if self.fair is not None:
            self.fair.kick()  # another gateway's request finished there: room for the next in turn

    async def _on_token(self, msg) -> None:
        rid = msg.subject.rsplit(".", 1)[-1]
        job = self.jobs.get(rid)
        if job is None or job.deltas is None or job.rerouted:
            return  # after a re-route, the rest of the text comes with the final result
        try:
            job.deltas.put_nowait(TokenDelta.model_validate_json(msg.data))
        except ValidationError:
            log.warning("ignoring an unreadable token delta on %s", msg.subject)

    def abandon(self, job: Job) -> None:
        """The caller gave up (deadline or disconnect): stop tracking; a later result is dropped."""
        self._answered.add(job.request_id)
        self._release(job)
        if not job.future.done():
            job.future.cancel()

    async def wait(self, job: Job, deadline: float) -> InferenceResult:
        """The checked result, or GatewayError (504 at the deadline, worker errors, digest mismatch)."""
        remaining = deadline - time.time()
        try:
            result = await asyncio.wait_for(asyncio.shield(job.future), timeout=max(0.0, remaining))
        except TimeoutError:
            self.abandon(job)
            raise errors.deadline(deadline - job.request.submitted_at) from None
        except asyncio.CancelledError:
            self.abandon(job)
            raise
        return check_result(job, result, self.metrics)

    async def events(self, job: Job, deadline: float) -> AsyncIterator[TokenDelta | InferenceResult]:
        """Streaming: deltas in order (text, and token logprobs when asked for), then the checked final
        result (what of it was not yet sent comes as one last delta). Raises GatewayError like `wait`."""
        sent, sent_logprobs = "", 0
        queue = job.deltas
        assert queue is not None, "events() needs a job submitted with stream=True"
        try:
            while not job.future.done():
                remaining = deadline - time.time()
                if remaining <= 0:
                    self.abandon(job)
                    raise errors.deadline(deadline - job.request.submitted_at)
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait(
                    {getter, job.future}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
                if getter in done:
                    delta = getter.result()
                    if not job.rerouted:
                        sent, sent_logprobs = sent + delta.text, sent_logprobs + len(delta.logprobs or ())
                        yield delta
                else:
                    getter.cancel()
            while not queue.empty() and not job.rerouted:
                delta = queue.get_nowait()
                sent, sent_logprobs = sent + delta.text, sent_logprobs + len(delta.logprobs or ())
                yield delta
            result = check_result(job, job.future.result(), self.metrics)
        except BaseException:
            if not job.future.done():
                self.abandon(job)
            raise
        if result.text.startswith(sent):
            rest = result.text[len(sent) :]
            rest_logprobs = result.logprobs[sent_logprobs:] if result.logprobs is not None else None
            if rest or rest_logprobs:
                yield TokenDelta(request_id=result.request_id, index=-1, text=rest, logprobs=rest_logprobs)
        else:  # text already streamed differs from the final answer (a re-route with sampling)
            raise GatewayError(
                502,
                "the request was re-routed after a worker failure and the new answer "
                "differs from the part already streamed",
                "stream_diverged",
            )
        yield result
