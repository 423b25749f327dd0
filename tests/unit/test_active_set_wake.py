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
