"""The worker: one vLLM engine with LoRA, consuming its affinitized slice of the inference stream.

It pulls from two durable consumers on the LPX_INFER work queue: its own (`lpx.infer.<pool>.<me>.>`,
where the gateway's affinity routing sends it work) and the pool's shared one (`lpx.infer.<pool>._any.>`,
hand-offs and re-routes), never more messages than it has free capacity. On SIGTERM it stops pulling,
finishes what is in flight and hands its unstarted backlog to the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from nats.errors import TimeoutError as NatsTimeout

from libs.bus.consumer import PullConsumer, durable_pull
from libs.bus.link import BrokerLink
from libs.bus.retry import is_transient
from libs.contracts import WorkerLoad, subjects
from libs.engine import create_engine
from libs.objectstore import ObjectStore
from libs.telemetry import Telemetry, inject_headers, setup_telemetry
from services.worker.batch_share import batch_share_for
from services.worker.bounded_take import BoundedTake, Capacity
from services.worker.disk_cache import DiskCache
from services.worker.engine_setup import admission_for, engine_config
from services.worker.heartbeat import Heartbeater, heartbeat_bucket_config
from services.worker.load_bound import LoadBound
from services.worker.metrics import WorkerMetrics, register_queue_gauges
from services.worker.placement import Placement
from services.worker.processor import RequestProcessor
from services.worker.settings import WorkerSettings
from services.worker.tiers import AdapterTiers

log = logging.getLogger(__name__)
# How long a leaving request's load report waits for the broker's word that it has it (a round trip on a
# healthy link): past it the result goes out anyway, and the report follows when the link allows.
REPORT_FLUSH_S = 0.5


class Worker:
    def __init__(self, settings: WorkerSettings, *, engine=None, telemetry: Telemetry | None = None) -> None:
        self.settings = settings
        self.worker_id = settings.worker_id
        self.telemetry = telemetry or setup_telemetry(
            "worker", metrics_port=settings.metrics_port, metrics_host=settings.metrics_host, set_global=False
        )
        self.metrics = WorkerMetrics.create(self.telemetry.meter())
        self.engine = engine or create_engine(engine_config(settings))
        self.store = ObjectStore(settings.connections)
        self.tiers = AdapterTiers(
            DiskCache(settings.resolved_disk_cache_dir(), settings.disk_cache_bytes, self.store),
            self.engine,
            base_model=settings.base_model,
            max_rank=settings.max_lora_rank,
            max_loras=settings.max_loras,
            max_cpu_loras=settings.max_cpu_loras,
        )
        self.admission = admission_for(settings)
        self.batch_share = batch_share_for(settings, getattr(self.engine, "device", "cpu"))
        # With a batch share the worker pulls what its engine could hold and the share picks who runs.
        self.capacity = Capacity(self.batch_share.most if self.batch_share else settings.capacity)
        self.placement = Placement(self, settings, self.tiers)
        self.bound = (
            LoadBound(
                self.worker_id,
                settings.balance_factor,
                self.telemetry.meter(),
                staleness_s=settings.placement_staleness_s,
            )
            if settings.load_bound
            else None
        )
        self.take = BoundedTake(
            self.capacity,
            self.bound,
            me=self.worker_id,
            pool=settings.pool,
            in_flight=lambda: self.in_flight,
            publish=lambda *args, **kwargs: self.js.publish(*args, **kwargs),
        )
        self.queue_depth = 0
        self.own_pending = 0  # routed to this worker and not yet taken (for the gateways' load view)
        self.answering = 0  # results stamped, being published and acknowledged (out of `in_flight`)
        self.leaving = 0  # results about to be stamped, already left out of the load reports
        self.handed_off = 0
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._loops: list[asyncio.Task] = []
        self._token_window: list[tuple[float, int]] = []
        register_queue_gauges(self.telemetry.meter(), self)

    @property
    def in_flight(self) -> int:
        """Taken and not yet answered: a stamped result (`result_sent_at`) being published no longer
        counts (the pool was told just before the stamp: `reported_in_flight`)."""
        return self.capacity.used - self.answering

    @property
    def reported_in_flight(self) -> int:
        """What the pool is told: results about to be stamped are already left out (see `_handle`)."""
        return self.in_flight - self.leaving

    # --- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        s = self.settings
        await self.engine.start()
        self.link = BrokerLink(
            s.connections,
            f"worker-{self.worker_id}",
            buckets=[heartbeat_bucket_config(s.heartbeat_ttl_s)],
            role="worker",
        )
        self.nc = await self.link.connect()
        self.js = self.link.js
        self.heartbeat = Heartbeater(self.link, self, s.heartbeat_interval_s, s.heartbeat_ttl_s)
        await self.heartbeat.claim()  # before taking the work subject of this id
        self.processor = RequestProcessor(
            worker_id=self.worker_id,
            nc=self.nc,
            js=self.js,
            engine=self.engine,
            tiers=self.tiers,
            metrics=self.metrics,
            ack_wait_s=s.ack_wait_s,
            admission=self.admission,
            batch_share=self.batch_share,
            token_batches=s.token_batches,
        )
        self.own = await self._consumer(
            subjects.infer_worker_filter(s.pool, self.worker_id), subjects.worker_durable(s.pool, self.worker_id)
        )
        self.shared = await self._consumer(subjects.infer_any_filter(s.pool), subjects.pool_durable(s.pool))
        self.link.on_back(self.heartbeat.beat_if_beating)  # back in the pool at once, not at the next interval
        await self.heartbeat.beat()
        self.heartbeat.start()
        if s.placement:
            await self.placement.start(self.nc)
        if self.bound is not None:
            self._load_sub = await self.nc.subscribe(subjects.pool_load_filter(s.pool), cb=self.bound.on_load)
        await self.report_load()  # in the others' load bound from now, not from its first request
        self._loops = [
            asyncio.create_task(self._pulling(self.own, "own").run(self._stopping), name="pull-own"),
            asyncio.create_task(self._pulling(self.shared, "pool").run(self._stopping), name="pull-pool"),
            asyncio.create_task(self._watch_queue(), name="queue-depth"),
        ]
        log.info("worker ready", extra={"worker": self.worker_id, "pool": s.pool, "capacity": s.capacity})

    async def _consumer(self, filter_subject: str, durable: str):
        return await durable_pull(
            self.link,
            subjects.INFER_STREAM,
            filter_subject,
            durable,
            ack_wait=self.settings.ack_wait_s,
            max_ack_pending=max(64, self.settings.capacity * 4),
        )

    async def run_until(self, stop: asyncio.Event) -> None:
        await stop.wait()
        await self.drain()

    async def drain(self) -> None:
        """Stop pulling, finish in-flight work, hand the unstarted backlog to the pool, leave."""
        log.info("draining", extra={"worker": self.worker_id, "in_flight": self.in_flight})
        self._stopping.set()
        for loop in self._loops:
            loop.cancel()
        await _bounded(asyncio.gather(*self._loops, return_exceptions=True), 10, "pull loops")
        log.debug("drain: pulling stopped", extra={"worker": self.worker_id})
        if self.batch_share is not None:  # pulled but not started: back to the queue, then handed off
            self.batch_share.hand_back_waiting()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=self.settings.drain_timeout_s)
        log.debug("drain: in-flight finished", extra={"worker": self.worker_id})
        await _bounded(self._hand_off_backlog(), 60, "hand-off")
        await _bounded(self.heartbeat.stop(), 10, "heartbeat stop")
        await _bounded(self.placement.stop(), 5, "placement stop")
        for sub in (self.own, self.shared):
            await _bounded(sub.unsubscribe(), 5, "unsubscribe")
        await _bounded(self.link.close(), 20, "nats close")
        log.info("drained", extra={"worker": self.worker_id, "handed_off": self.handed_off})

    async def close(self) -> None:
        await self.engine.shutdown()
        self.telemetry.shutdown()

    # --- pulling -------------------------------------------------------------------------------
    def _pulling(self, sub, name: str) -> PullConsumer:
        async def start(msgs: list) -> None:
            msgs = await self.take.take(name, msgs)
            # Stamped as kept, where the bound was checked: a task starting later on a busy loop would
            # stamp a moment the check never saw (the fleet benchmark reconstructs loads from it).
            taken_at = time.time()
            await self.report_load()
            for msg in msgs:
                self._spawn(msg, taken_at)

        return PullConsumer(
            sub,
            name,
            room=lambda: self.take.room(name),
            deliver=start,
            poll_s=0.5,
            max_batch=16,
            after_failure=self._recreate_consumers,
        )

    async def report_load(self, flush: bool = False) -> float:
        """Tell the gateways and the pool's workers this worker's in-flight count now (core NATS, fire and
        forget): on every change, and with every heartbeat (the workers' load bound counts live workers).
        `flush`: return only once the broker has it. Returns the report's time."""
        load = WorkerLoad(worker_id=self.worker_id, pool=self.settings.pool, in_flight=self.reported_in_flight)
        with contextlib.suppress(Exception):  # best effort: the heartbeat carries it too
            await self.nc.publish(
                subjects.worker_load(self.settings.pool, self.worker_id), load.model_dump_json().encode()
            )
            if flush:
                await self.nc.flush(timeout=REPORT_FLUSH_S)
        return load.ts

    async def _recreate_consumers(self) -> None:
        """Connected but a fetch failed: the consumer may be gone (a gateway retired it while this worker
        looked dead to it). Creating a durable that exists is a no-op, so just ensure them again."""
        if not self.nc.is_connected:
            return
        with contextlib.suppress(Exception):
            await self.link.provision()

    def _spawn(self, msg, taken_at: float | None = None) -> None:
        task = asyncio.create_task(self._handle(msg, taken_at))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, msg, taken_at: float | None = None) -> None:
        """One request. Its end is told to the pool before its result is stamped, and the worker's own
        count drops at the stamp: every other worker's view of this load then falls before the fleet's
        true load does (a view above the truth would raise its bound over the true one), and the gateways
        stop counting it as of that report (`load_left_at`)."""
        self.metrics.in_flight.add(1)
        announced = answered = False

        async def leaving() -> float:
            nonlocal announced
            if not announced:
                announced = True
                self.leaving += 1
            # Flushed only for the workers' own bound: the gateways need the report's time, not its arrival.
            return await self.report_load(flush=self.bound is not None)

        async def answering() -> None:
            nonlocal answered
            if not answered:
                answered = True
                self.answering += 1
                self.leaving -= announced  # the reported count is unchanged: nothing to report

        try:
            await self.processor.handle(msg, on_result=answering, taken_at=taken_at, on_leaving=leaving)
        except Exception as exc:
            if is_transient(exc):  # the broker is away: expected, no traceback
                log.warning(
                    "request not finished while the broker is unavailable (%s); it will be redelivered",
                    type(exc).__name__,
                    extra={"subject": msg.subject},
                )
            else:
                log.exception("request handling failed; leaving it for redelivery", extra={"subject": msg.subject})
        finally:
            self.leaving -= announced and not answered
            self.answering -= answered
            self.metrics.in_flight.add(-1)
            await self.capacity.give_back(1)
            if not answered:  # else reported when its result was stamped: the load is unchanged now
                await self.report_load()
            self._token_window.append((time.monotonic(), self.processor.generated_tokens))

    async def _hand_off_backlog(self) -> int:
        """Move messages routed to this worker but never started to the pool's shared subject."""
        moved = 0
        while True:
            try:
                msgs = await self.own.fetch(batch=16, timeout=0.5)
            except (TimeoutError, NatsTimeout):
                return moved
            for msg in msgs:
                adapter_token = msg.subject.rsplit(".", 1)[-1]
                headers = dict(msg.headers or {})
                headers["Nats-Msg-Id"] = f"{headers.get('Nats-Msg-Id', msg.reply)}-handoff-{self.worker_id}"
                await self.js.publish(
                    subjects.infer_any(self.settings.pool, adapter_token), msg.data, headers=inject_headers(headers)
                )
                await msg.ack()
                self.handed_off += 1

    async def _watch_queue(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                own, shared = await self.own.consumer_info(), await self.shared.consumer_info()
                self.queue_depth = own.num_pending + shared.num_pending
                self.own_pending = own.num_pending
            await asyncio.sleep(2.0)

    def tokens_per_s(self, window_s: float = 10.0) -> float:
        now = time.monotonic()
        self._token_window = [(t, n) for t, n in self._token_window if now - t <= window_s]
        if len(self._token_window) < 2:
            return 0.0
        (t0, n0), (t1, n1) = self._token_window[0], self._token_window[-1]
        return (n1 - n0) / max(t1 - t0, 1e-6)


async def _bounded(awaitable, timeout_s: float, what: str) -> bool:
    """Run one drain step with a time limit: a stuck step must not keep the worker from exiting.

    Not `asyncio.wait_for`: on timeout it cancels the step and then waits for the step to end, for ever
    when the step swallows the cancellation (nats-py's close and unsubscribe can). Here a step still
    running at the limit is cancelled and left behind."""
    step = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({step}, timeout=timeout_s)
    if not done:
        step.cancel()
        log.warning("drain step %s did not finish within %.0fs; left behind", what, timeout_s)
        return False
    if step.cancelled() or step.exception() is not None:
        why = "cancelled" if step.cancelled() else type(step.exception()).__name__
        log.warning("drain step %s did not finish cleanly: %s", what, why)
        return False
    return True
