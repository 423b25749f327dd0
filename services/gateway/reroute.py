"""Re-routing the unfinished requests of workers that left.

* A crashed worker (heartbeat expired by the bucket's TTL or older than the staleness limit): its
  unfinished requests are re-published at once to live workers of the same pool chosen by the router,
  or to the pool-shared subject when none is live, with a new Nats-Msg-Id (the request id stays the
  same, so the first result wins at the gateway and workers skip requests already answered).
* A worker that left cleanly (its drain deleted its key after finishing in-flight work and handing
  its backlog to the pool) gets a grace period first: only what is still unanswered after it is
  re-published, so a clean drain is not doubled by a re-route.

Then the worker's durable consumer is retired: what is left on its subjects is purged and the consumer
deleted, so a fleet where workers come and go does not accumulate dead consumers and stranded messages.
Nothing is lost by the purge: every gateway re-publishes its own stranded requests from memory (each
sees the worker leave), and an async submission whose gateway died is redelivered to another gateway
by the submission stream. Every gateway may retire the same worker; the second finds nothing to do. A
worker that was only cut off and comes back re-creates its consumer (services/worker/app.py).
"""

from __future__ import annotations

import asyncio
import logging

from nats.js.errors import KeyDeletedError, KeyNotFoundError, NotFoundError
from nats.js.kv import KV_DEL, KV_PURGE

from libs.contracts import subjects
from services.gateway.dispatch import Dispatcher, Job

log = logging.getLogger(__name__)


class Rerouter:
    def __init__(self, dispatcher: Dispatcher, *, drain_grace_s: float = 30.0) -> None:
        self.dispatcher = dispatcher
        self.drain_grace_s = drain_grace_s
        self.rerouted = 0
        self.retired = 0
        self._tasks: set[asyncio.Task] = set()

    def on_dead(self, workers: set[str]) -> None:
        """PoolView callback (synchronous): schedule the re-routes."""
        for worker in workers:
            task = asyncio.create_task(self._handle(worker), name=f"reroute-{worker}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _handle(self, worker: str) -> None:
        if await self._left_cleanly(worker):
            log.info(
                "worker drained; re-routing what is left after a grace period",
                extra={"worker": worker, "grace_s": self.drain_grace_s},
            )
            await asyncio.sleep(self.drain_grace_s)
            live = set(self.dispatcher.pools.live)
            if worker in live:
                return  # it came back
            await self.reroute(worker, reason="drained")
        else:
            await self.reroute(worker, reason="lost")
        await self.retire(worker)

    async def retire(self, worker: str) -> bool:
        """Purge what is left routed to a worker that left, and delete its durable consumer."""
        d = self.dispatcher
        pool = d.pools.last_pool.get(worker)
        if pool is None or worker in d.pools.live:
            return False  # unknown, or it came back meanwhile
        try:
            await d.js.purge_stream(subjects.INFER_STREAM, subject=subjects.infer_worker_filter(pool, worker))
            await d.js.delete_consumer(subjects.INFER_STREAM, subjects.worker_durable(pool, worker))
        except NotFoundError:
            return False  # another gateway retired it first
        except Exception as exc:
            log.warning("could not retire the consumer of worker %s: %s", worker, type(exc).__name__)
            return False
        self.retired += 1
        d.pools.last_pool.pop(worker, None)
        log.info("retired the consumer of a worker that left", extra={"worker": worker, "pool": pool})
        return True

    async def _left_cleanly(self, worker: str) -> bool:
        kv = self.dispatcher.pools._kv
        if kv is None:
            return False
        try:
            await kv.get(worker)
        except (KeyDeletedError, KeyNotFoundError) as exc:
            # A delete marker: the worker removed its own key. nats-py 2.16's `get` reports the marker as
            # KeyNotFoundError carrying its operation; a key that expired or never was has none.
            return isinstance(exc, KeyDeletedError) or exc.op in (KV_DEL, KV_PURGE)
        except Exception:
            return False
        return False  # still there but stale: lost

    async def reroute(self, worker: str, *, reason: str) -> int:
        d = self.dispatcher
        stranded = [j for j in d.jobs.values() if j.worker == worker and not j.future.done()]
        for job in stranded:
            await self._reroute_one(job, reason)
        if stranded:
            log.warning(
                "re-routed unfinished requests", extra={"worker": worker, "count": len(stranded), "reason": reason}
            )
        return len(stranded)

    async def _reroute_one(self, job: Job, reason: str) -> None:
        d = self.dispatcher
        workers = d.pools.pool_workers(job.pool)
        job.attempts += 1
        job.rerouted = True
        if workers:
            target = d.route(job.pool, workers, job.token).worker
            subject = subjects.infer(job.pool, target, job.token)
        else:  # nobody live: the pool's shared consumer takes it when a worker (re)joins
            target = subjects.ANY_WORKER
            subject = subjects.infer_any(job.pool, job.token)
        d.move(job, target)
        try:
            await d.publish(job, subject, f"{job.request_id}-reroute-{job.attempts}")
        except Exception:
            log.exception("re-route publish failed", extra={"request_id": job.request_id})
            return
        self.rerouted += 1
        d.metrics.reroutes.add(1, {"pool": job.pool, "reason": reason})
        log.info("re-routed", extra={"request_id": job.request_id, "to": target, "attempt": job.attempts})
