"""Read what the registry put on JetStream (the events and dead-letter streams), for assertions."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import nats
from nats.js.api import ConsumerConfig, DeliverPolicy

from libs.contracts import AdapterEvent, DeadLetter, subjects


async def stream_messages(nats_url: str, stream: str, subject: str) -> list:
    """Every stored message of `stream` on `subject` (an ephemeral consumer from the first one)."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe(subject, stream=stream, config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL))
        found = []
        while True:
            try:
                batch = await sub.fetch(256, timeout=0.5)
            except (TimeoutError, nats.errors.TimeoutError):
                break
            found.extend(batch)
            for msg in batch:
                await msg.ack()
        await sub.unsubscribe()
        return found
    finally:
        await nc.drain()


async def adapter_events(nats_url: str, tenant: str | None = None) -> list[tuple[str, AdapterEvent]]:
    """(Nats-Msg-Id, event) for every stored adapter event, optionally of one tenant, in stream order."""
    found = []
    for msg in await stream_messages(nats_url, subjects.EVENTS_STREAM, subjects.ADAPTER_EVENTS):
        try:
            event = AdapterEvent.model_validate_json(msg.data)
        except ValueError:
            continue  # not the registry's: e.g. the malformed events the eval gate's tests publish
        if tenant is None or event.tenant == tenant:
            found.append(((msg.headers or {}).get("Nats-Msg-Id", ""), event))
    return found


async def stored_messages(nats_url: str, stream: str, subject: str) -> list:
    """The messages of `stream` on `subject`, read by sequence without a consumer (a work-queue
    stream refuses a second consumer that overlaps its trainers' one, and a consumer would take them)."""
    from nats.js.errors import NotFoundError

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        state = (await js.stream_info(stream)).state
        found = []
        for seq in range(state.first_seq, state.last_seq + 1) if state.messages else ():
            try:
                msg = await js.get_msg(stream, seq)
            except NotFoundError:
                continue
            if msg.subject == subject:
                found.append(msg)
        return found
    finally:
        await nc.drain()


async def msg_id_counts(nats_url: str) -> Counter:
    return Counter(msg_id for msg_id, _ in await adapter_events(nats_url))


async def dead_letters(nats_url: str) -> list[DeadLetter]:
    msgs = await stream_messages(nats_url, subjects.DLQ_STREAM, subjects.dead_letter("registry"))
    return [DeadLetter.model_validate_json(m.data) for m in msgs]


async def wait_until(check, timeout_s: float = 15.0, interval_s: float = 0.1):
    """Poll an async `check` until it returns something truthy; returns that value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(interval_s)
