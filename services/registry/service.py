"""The registry process's moving parts besides HTTP: migrations and seeding at start-up, the NATS
broker (resolve responder, eval-result consumer), the outbox relay, the active adapter set (for the
workers' placement) and the orphan sweeper."""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy import text
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential

from libs.bus.faststream_broker import make_broker
from libs.bus.link import BrokerLink
from libs.eventloop import end_if_cancelling
from libs.objectstore import ObjectStore
from services.registry import eval_context, eval_events, orphans, resolver, usage
from services.registry.active_set import ActiveSetPublisher, active_set_bucket_config
from services.registry.bases import seed_catalog
from services.registry.context import FaultHooks, RegistryContext
from services.registry.db import is_unavailable, make_engine, make_sessions, migrate, transaction
from services.registry.deadletters import DeadLetters
from services.registry.nats_access import NatsAccess
from services.registry.outbox import OutboxRelay, jetstream_publisher
from services.registry.settings import RegistrySettings

log = logging.getLogger(__name__)
SWEEP_EVERY_S = 600.0


class RegistryService:
    def __init__(
        self, settings: RegistrySettings, hooks: FaultHooks | None = None, telemetry=None, start_timeout_s: float = 60.0
    ) -> None:
        self.settings = settings
        self.hooks = hooks or FaultHooks()
        self.telemetry = telemetry
        self.start_timeout_s = start_timeout_s
        self.ctx: RegistryContext | None = None
        self.broker = None
        self.relay: OutboxRelay | None = None
        self._tasks: list[asyncio.Task] = []
        self._consumers: list[asyncio.Task] = []
        self._stopping = asyncio.Event()

    async def start(self) -> RegistryContext:
        conn = self.settings.connections
        await self._until_reachable(self._prepare_database)
        engine = make_engine(conn.pg_dsn)
        store = ObjectStore(conn)
        await asyncio.to_thread(store.ensure_bucket)
        self.ctx = RegistryContext(self.settings, engine, make_sessions(engine), store, hooks=self.hooks)
        if self.settings.seed_catalog:
            async with transaction(self.ctx.sessions) as session:
                await seed_catalog(session)
        await self._start_broker()
        self.relay = OutboxRelay(
            self.ctx.sessions, jetstream_publisher(self.broker), self.settings.outbox_poll_s, self.settings.outbox_batch
        )
        self.active_set = ActiveSetPublisher(self.ctx.sessions, self.link, self.settings.active_set_every_s)
        self.ctx.wake_relay = self._wake_after_commit
        self._tasks = [
            asyncio.create_task(self.relay.run(), name="outbox-relay"),
            asyncio.create_task(self.active_set.run(), name="active-set"),
            asyncio.create_task(self._sweep_periodically(), name="orphan-sweeper"),
        ]
        log.info("registry started")
        return self.ctx

    def _wake_after_commit(self) -> None:
        """A transaction wrote events: publish them now, and bring the active set along (an activation)."""
        self.relay.wake()
        self.active_set.wake()

    async def _prepare_database(self) -> None:
        if self.settings.migrate_on_start:
            await migrate(self.settings.connections.pg_dsn)

    async def _until_reachable(self, step) -> None:
        """Start-up waits for PostgreSQL (compose starts everything at once) instead of crashing."""
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(is_unavailable),
            reraise=True,
            stop=stop_after_delay(self.start_timeout_s),
            wait=wait_exponential(multiplier=0.2, max=3),
        ):
            with attempt:
                await step()

    async def _start_broker(self) -> None:
        telemetry = self.telemetry
        # The link reports the broker connection's state changes and re-provisions the streams after a
        # reconnect (the outbox relay publishes into them).
        self.link = BrokerLink(self.settings.connections, "registry", buckets=[active_set_bucket_config()])
        self.broker = make_broker(
            self.settings.connections.nats_url,
            "registry",
            tracer_provider=telemetry.tracer_provider if telemetry else None,
            meter_provider=telemetry.meter_provider if telemetry else None,
            **self.link.callbacks(),
        )
        dead_letters = DeadLetters(self.broker)
        resolver.register(self.broker, self.ctx, dead_letters)
        eval_context.register(self.broker, self.ctx, dead_letters)
        await self.broker.start()
        await self.link.attach(self.broker.config.connection_state.connection)
        self.ctx.link = self.link
        # JetStream work (verdicts, usage) goes through the one pull loop; FastStream serves the
        # request/reply subjects (resolve, auth, eval context): see libs.bus.
        self._consumers = [
            asyncio.create_task(
                eval_events.consume(self.link, self.ctx, dead_letters, self._stopping), name="verdicts"
            ),
            asyncio.create_task(usage.consume(self.link, self.ctx, dead_letters, self._stopping), name="usage"),
        ]
        self.ctx.nats_access = NatsAccess(self.ctx)
        await self.ctx.nats_access.start()

    async def _sweep_periodically(self) -> None:
        while True:
            try:
                await orphans.sweep_orphans(self.ctx)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("orphan sweep failed: %s", exc)
            end_if_cancelling()  # a cancel Python 3.11's wait_for swallowed inside the sweep
            await asyncio.sleep(SWEEP_EVERY_S)

    async def ready(self) -> tuple[bool, dict[str, str]]:
        """Readiness: the database answers and the broker is connected."""
        checks: dict[str, str] = {}
        try:
            async with self.ctx.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
            checks["database"] = "ok"
        except Exception as exc:
            checks["database"] = f"unavailable: {type(exc).__name__}"
        connection = getattr(self.broker.config.connection_state, "connection", None) if self.broker else None
        checks["nats"] = "ok" if connection is not None and connection.is_connected else "unavailable"
        return all(v == "ok" for v in checks.values()), checks

    async def stop(self) -> None:
        self._stopping.set()
        for task in self._consumers:
            task.cancel()
        await asyncio.gather(*self._consumers, return_exceptions=True)
        for task in self._tasks:
            task.cancel()
        if self._tasks:  # bounded: a task that swallowed its cancel must not hold the stop for ever
            done, stuck = await asyncio.wait(self._tasks, timeout=10)
            for task in done:
                if not task.cancelled():
                    task.exception()  # retrieved, as the former `await task` did (each logs its own errors)
            for task in stuck:
                log.warning("background task %s did not stop within 10 s; left behind", task.get_name())
        if self.ctx is not None and self.ctx.nats_access is not None:
            await self.ctx.nats_access.stop()
        if self.broker is not None:
            self.link.closing()
            await self.broker.stop()
        if self.ctx is not None:
            await self.ctx.engine.dispose()
        log.info("registry stopped")
