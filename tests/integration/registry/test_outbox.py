"""Outbox -> JetStream: every committed event reaches the stream exactly once, and a re-publish
(a relay that crashed after publishing but before marking the row) is de-duplicated by Nats-Msg-Id."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from tests.integration.registry.events import msg_id_counts, wait_until

pytestmark = pytest.mark.integration


async def outbox_rows(registry) -> list[tuple[str, bool, int]]:
    async with registry.ctx.engine.connect() as conn:
        rows = await conn.execute(text("SELECT event_id, published_at IS NOT NULL, attempts FROM outbox ORDER BY seq"))
        return [tuple(r) for r in rows]


async def all_published(registry):
    rows = await outbox_rows(registry)
    return rows if rows and all(published for _, published, _ in rows) else None


@pytest.fixture(scope="module")
async def pushed(registry, adapter_dirs):
    await registry.create_tenant("outbox")
    reply = await registry.push("outbox", "relay", adapter_dirs["good"])
    assert reply.status_code == 201, reply.text
    return reply.json()["version"]


async def test_every_committed_event_is_in_the_stream_once(registry, connections, pushed):
    rows = await wait_until(lambda: all_published(registry))
    assert rows, "the relay did not publish the outbox"
    counts = await msg_id_counts(connections.nats_url)
    assert {event_id: counts[event_id] for event_id, _, _ in rows} == {event_id: 1 for event_id, _, _ in rows}


async def test_a_republish_is_deduplicated(registry, connections, pushed):
    await wait_until(lambda: all_published(registry))
    async with registry.ctx.engine.begin() as conn:  # as if the relay died before marking them
        await conn.execute(text("UPDATE outbox SET published_at = NULL"))
    registry.service.relay.wake()
    rows = await wait_until(lambda: all_published(registry))
    assert rows and all(attempts >= 2 for _, _, attempts in rows)  # really published a second time
    counts = await msg_id_counts(connections.nats_url)
    assert all(counts[event_id] == 1 for event_id, _, _ in rows), counts
