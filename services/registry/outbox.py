"""The transactional outbox: events are rows written in the same transaction as the change they
announce, and a relay publishes them to JetStream afterwards.

Crash safety: a crash after the commit and before the publish leaves the row unpublished, so the
relay publishes it later; a crash after the publish and before the row is marked makes the relay
publish it again, and JetStream drops the copy because the Nats-Msg-Id (the event id) repeats
within the stream's duplicate window. Rows are claimed with FOR UPDATE SKIP LOCKED, so several
registry replicas can run relays side by side without publishing the same row concurrently.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from libs.contracts import AdapterEvent, subjects
from libs.eventloop import end_if_cancelling
from services.registry.db import Sessions, transaction
from services.registry.models import OutboxEvent, utcnow

log = logging.getLogger(__name__)

# (subject, JSON payload, event id) -> awaits the stream's acknowledgement or raises.
Publish = Callable[[str, str, str], Awaitable[None]]
MSG_ID_HEADER = "Nats-Msg-Id"


def enqueue(session: AsyncSession, event: AdapterEvent) -> OutboxEvent:
    """Add `event` to the outbox of the caller's transaction (it is published only if that commits)."""
    return enqueue_message(session, subjects.adapter_event(event.kind), event, event.event_id)


def enqueue_message(session: AsyncSession, subject: str, message, message_id: str) -> OutboxEvent:
    """Any message (e.g. a TrainJob for the work queue) through the outbox, Nats-Msg-Id = message_id."""
    row = OutboxEvent(event_id=message_id, subject=subject, payload=message.model_dump_json())
    session.add(row)
    return row


class OutboxRelay:
    def __init__(
        self,
        sessions: Sessions,
        publish: Publish,
        poll_s: float = 0.5,
        batch: int = 100,
        after_publish: Callable[[OutboxEvent], None] | None = None,
    ) -> None:
        self.sessions = sessions
        self.publish = publish
        self.poll_s = poll_s
        self.batch = batch
        # Test seam: called after each successful publish, before the row is marked (crash injection).
        self.after_publish = after_publish
        self._wake = asyncio.Event()
        self.publish_error: str | None = None  # of the last round, if a publish failed

    def wake(self) -> None:
        """Called after a commit that wrote events, so they go out without waiting for the next poll."""
        self._wake.set()

    async def run(self) -> None:
        from libs.bus.state import ConnectionState

        state = ConnectionState("outbox relay (PostgreSQL or NATS)")
        backoff = self.poll_s
        while True:
            end_if_cancelling()  # a cancel Python 3.11's wait_for swallowed in a batch, also one that then failed
            try:
                published = await self.relay_once()
                backoff = self.poll_s
                if self.publish_error:
                    state.failed(self.publish_error)
                else:
                    state.ok()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                state.failed(exc)  # one line per outage, not one per retry
                published = 0
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            end_if_cancelling()  # before the wait too: a stopping registry waits for this task
            if published < self.batch:
                await self._sleep_until_woken()

    async def _sleep_until_woken(self) -> None:
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=self.poll_s)
        except TimeoutError:
            pass
        self._wake.clear()

    async def relay_once(self) -> int:
        """Publish one batch of unpublished events in order; returns how many went out."""
        async with transaction(self.sessions) as session:
            query = (
                select(OutboxEvent)
                .where(col(OutboxEvent.published_at).is_(None))
                .order_by(col(OutboxEvent.seq))
                .limit(self.batch)
                .with_for_update(skip_locked=True)
            )
            rows = list((await session.exec(query)).all())
            sent = 0
            self.publish_error = None
            for row in rows:
                row.attempts += 1
                try:
                    await self.publish(row.subject, row.payload, row.event_id)
                except Exception as exc:
                    row.last_error = f"{type(exc).__name__}: {exc}"[:500]
                    self.publish_error = row.last_error
                    log.debug("outbox relay: publish of %s failed: %s", row.event_id, row.last_error)
                    break
                if self.after_publish:
                    self.after_publish(row)
                row.published_at = utcnow()
                row.last_error = None
                sent += 1
        return sent


async def unpublished_count(session: AsyncSession) -> int:
    rows = await session.exec(select(OutboxEvent.seq).where(col(OutboxEvent.published_at).is_(None)))
    return len(rows.all())


def jetstream_publisher(broker, timeout_s: float = 5.0) -> Publish:
    """Publish through a FastStream NATS broker and wait for the PubAck of the stream that stores the
    subject (lifecycle events, training jobs)."""
    import json

    async def publish(subject: str, payload: str, event_id: str) -> None:
        stream = subjects.stream_of(subject)
        ack = await broker.publish(
            json.loads(payload), subject, headers={MSG_ID_HEADER: event_id}, stream=stream, timeout=timeout_s
        )
        if ack is not None and getattr(ack, "duplicate", False):
            log.info("outbox relay: %s was already in %s (de-duplicated re-publish)", event_id, stream)

    return publish
