"""Delivery: results and tokens back to the request that waits for them.

Workers publish each InferenceResult to `subjects.results(rid)` (this gateway's own subjects when it
has a gateway id) and stream tokens to `subjects.tokens(rid)`, or one engine step's tokens of all this
gateway's requests as one TokenBatch. The first result per request id wins;
later ones (after a re-route) are dropped and counted. A result whose applied digest differs from the
resolved one is an error to the caller and a counted alert, never a silent success. Results stored in
the RESULTS stream while a live delivery was missed (a broker outage) are looked up: at once when the
broker is back, and by a periodic sweep for requests older than its period."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from nats.js.errors import NotFoundError
from pydantic import ValidationError

from libs.bus.recent_ids import RecentIds
from libs.bus.state import ConnectionState
from libs.contracts import InferenceResult, TokenBatch, TokenDelta, WorkerLoad, subjects
from services.gateway import errors
from services.gateway.dispatch.admission import Admission
from services.gateway.dispatch.job import Job
from services.gateway.dispatch.ledger import InFlight
from services.gateway.dispatch.settings import DeliverySettings
from services.gateway.errors import GatewayError
from services.gateway.metrics import GatewayMetrics

log = logging.getLogger(__name__)


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


class Delivery:
    def __init__(
        self,
        nc,
        js,
        settings: DeliverySettings,
        metrics: GatewayMetrics,
        ledger: InFlight,
        admission: Admission,
        release: Callable[..., None],
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.ledger = ledger
        self.admission = admission
        self._release = release
        self.answered = RecentIds(limit=100_000)
        self._subs: list = []
        self._sweeper: asyncio.Task | None = None
        self._lookups = ConnectionState("results stream lookups")
        self.nc, self.js = nc, js

    async def start(self) -> None:
        nc = self.nc
        results, tokens = subjects.RESULTS_ALL, subjects.TOKENS_ALL
        if self.settings.gateway_id:
            gateway_id = self.settings.gateway_id
            results, tokens = subjects.results_to_filter(gateway_id), subjects.tokens_to_filter(gateway_id)
        self._subs = [
            await nc.subscribe(results, cb=self.on_result),
            await nc.subscribe(tokens, cb=self.on_token),
            await nc.subscribe(subjects.WORKER_LOAD_ALL, cb=self.on_load),
        ]
        await nc.flush()
        self._sweeper = asyncio.create_task(self._sweep(), name="results-catch-up")

    async def stop(self) -> None:
        if self._sweeper:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def on_result(self, msg) -> None:
        self.deliver(msg.data, msg.subject)

    async def catch_up(self, older_than_s: float = 0.0) -> int:
        """Deliver results already stored for requests in flight (missed while disconnected)."""
        now, found = time.monotonic(), 0
        for rid, job in list(self.ledger.jobs.items()):
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
            if self.deliver(stored.data, stored.subject):
                found += 1
        if found:
            log.info("results caught up from the stream", extra={"count": found})
        return found

    async def _sweep(self) -> None:
        every = self.settings.catch_up_every_s
        while True:
            await asyncio.sleep(every)
            if self.nc.is_connected:
                await self.catch_up(older_than_s=every)

    def deliver(self, data: bytes, subject: str) -> bool:
        try:
            result = InferenceResult.model_validate_json(data)
        except ValidationError:
            log.warning("ignoring an unreadable result on %s", subject)
            return False
        job = self.ledger.jobs.get(result.request_id)
        if job is None or job.future.done():
            if result.request_id in self.answered:
                self.metrics.duplicate_results.add(1)
                log.info("dropped a later result", extra={"request_id": result.request_id, "worker": result.worker_id})
            return False
        self.answered.add(result.request_id)
        job.received_at = time.time()
        # Counted here, once per request id, so that HTTP and async submissions, streamed or not, are
        # counted alike (a re-routed request's later result was dropped above).
        tenant = {"tenant": job.request.tenant_id}
        self.metrics.tokens.add(result.prompt_tokens, {**tenant, "kind": "prompt"})
        self.metrics.tokens.add(result.completion_tokens, {**tenant, "kind": "completion"})
        if result.ok:
            self.admission.observe(job.pool, result.timings.total_s)
        self._release(job, result.timings.load_left_at or result.timings.result_sent_at or None)
        job.future.set_result(result)
        return True

    async def on_load(self, msg) -> None:
        try:
            load = WorkerLoad.model_validate_json(msg.data)
        except ValidationError:
            return
        self.ledger.fleet.reported(load.worker_id, load.in_flight, load.ts)
        self.admission.released()  # another gateway's request finished there: room for the next in turn

    async def on_token(self, msg) -> None:
        """A request's token delta on its own subject, or one engine step's deltas of a worker (TokenBatch)."""
        try:
            if subjects.is_token_batch(msg.subject):
                batch = TokenBatch.model_validate_json(msg.data)
                self.metrics.token_messages.add(1, {"form": "batch"})
                for delta in batch.deltas:
                    self._deliver_token(delta.request_id, delta)
                return
            delta = TokenDelta.model_validate_json(msg.data)
        except ValidationError:  # tokens are best effort: the final result carries the whole text
            log.warning("ignoring unreadable token deltas on %s", msg.subject)
            return
        self.metrics.token_messages.add(1, {"form": "single"})
        self._deliver_token(msg.subject.rsplit(".", 1)[-1], delta)

    def _deliver_token(self, rid: str, delta: TokenDelta) -> None:
        job = self.ledger.jobs.get(rid)
        if job is None or job.deltas is None or job.rerouted or job.next_delta is None:
            return  # after a re-route or a missed delta, the rest of the text comes with the final result
        if delta.index != job.next_delta:  # forwarding it would leave a hole in the streamed text
            log.info(
                "request %s: token delta %d missed (got %d); the rest streams with its result",
                rid,
                job.next_delta,
                delta.index,
            )
            self.metrics.token_gaps.add(1)
            job.next_delta = None
            return
        job.next_delta += 1
        job.deltas.put_nowait(delta)

    def abandon(self, job: Job) -> None:
        """The caller gave up (deadline or disconnect): stop tracking; a later result is dropped."""
        self.answered.add(job.request_id)
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
