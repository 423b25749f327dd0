"""The outbox relay ends when the registry stops, also after a cancel that Python 3.11's wait_for swallowed
inside a batch (under a nats-py request) and a batch that then failed: the stopping registry waits for it."""

from __future__ import annotations

import asyncio

from services.registry.outbox import OutboxRelay


async def test_a_swallowed_cancel_then_a_failing_batch_still_ends_the_relay():
    relay = OutboxRelay(sessions=None, publish=None, poll_s=0.05)
    entered = asyncio.Event()
    batches = []

    async def relay_once() -> int:
        batches.append(1)
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass  # swallowed, as the 3.11 wait_for race does
        raise ConnectionError("the database went away as the registry stopped")

    relay.relay_once = relay_once
    task = asyncio.create_task(relay.run())
    await entered.wait()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2.0)
    assert task in done, f"the relay went on retrying after a swallowed cancel ({len(batches)} batches)"
    assert task.cancelled() and len(batches) == 1
