"""The registry's active-set publisher (services/registry/active_set.py) runs a round at once when a
commit wakes it, also when the commit lands while a round is running: that round read the database
before the commit, so only the next one carries it."""

from __future__ import annotations

import asyncio

from services.registry.active_set import ActiveSetPublisher


async def test_a_wake_during_a_round_runs_the_next_round_at_once():
    publisher = ActiveSetPublisher(sessions=None, link=None, every_s=30.0)
    rounds: list[float] = []
    loop = asyncio.get_running_loop()

    async def sync_once() -> tuple[int, int]:
        rounds.append(loop.time())
        if len(rounds) == 1:
            await asyncio.sleep(0.05)
            publisher.wake()  # a commit lands while the first round runs
            await asyncio.sleep(0.05)
        return 0, 0

    publisher.sync_once = sync_once
    task = asyncio.create_task(publisher.run())
    try:
        for _ in range(40):
            if len(rounds) >= 2:
                break
            await asyncio.sleep(0.05)
        assert len(rounds) >= 2, "the wake during the round was lost: the next round waits every_s"
        assert rounds[1] - rounds[0] < 1.0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _rounds_until(publisher, sync_once, done) -> asyncio.Task:
    publisher.sync_once = sync_once
    task = asyncio.create_task(publisher.run())
    for _ in range(60):
        if done() or task.done():
            break
        await asyncio.sleep(0.05)
    return task


async def test_a_round_that_hangs_or_is_cancelled_under_it_is_a_failed_round_and_the_next_one_runs():
    publisher = ActiveSetPublisher(sessions=None, link=None, every_s=0.05)
    publisher.round_timeout_s = 0.2
    calls = []

    async def sync_once() -> tuple[int, int]:
        calls.append(1)
        if len(calls) == 1:
            await asyncio.Event().wait()  # a request nobody answers
        if len(calls) == 2:
            raise asyncio.CancelledError  # a request future nats-py cancelled as its connection went
        return 0, 0

    task = await _rounds_until(publisher, sync_once, lambda: publisher.rounds >= 1)
    try:
        assert not task.done(), "the publisher stopped on a failed round"
        assert publisher.failures == 2 and publisher.rounds >= 1, (publisher.failures, publisher.rounds)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled(), "the registry's own stop must still end the publisher"


async def test_a_cancel_swallowed_inside_a_round_still_ends_the_publisher_at_once():
    # Python 3.11's wait_for (under nats-py's requests) can swallow a cancel that arrives as its future
    # completes: the round then returns normally. The publisher must end before its every_s wait, since the
    # stopping registry waits for it.
    publisher = ActiveSetPublisher(sessions=None, link=None, every_s=30.0)
    entered = asyncio.Event()

    async def sync_once() -> tuple[int, int]:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass  # swallowed, as the 3.11 wait_for race does
        return 0, 0

    publisher.sync_once = sync_once
    task = asyncio.create_task(publisher.run())
    await entered.wait()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2.0)
    assert task in done, "the publisher went on to its 30 s wait after a swallowed cancel"
    assert task.cancelled()
