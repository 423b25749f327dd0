"""The worker's batch share: a calm tenant starts at once beside a flood, the flood drains to the
protected batch size while the calm tenant has work, and one tenant alone keeps the whole batch."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from services.worker.batch_share import BatchShare, HandedBack


class Holder:
    """Requests that take a place and keep it until told to finish."""

    def __init__(self, share: BatchShare) -> None:
        self.share = share
        self.started: list[str] = []
        self._finish: dict[int, asyncio.Event] = {}
        self._tasks: list[asyncio.Task] = []

    def submit(self, tenant: str) -> int:
        n = len(self._tasks)
        self._finish[n] = asyncio.Event()
        self._tasks.append(asyncio.create_task(self._run(n, tenant)))
        return n

    async def _run(self, n: int, tenant: str) -> None:
        async with self.share.slot(tenant):
            self.started.append(f"{tenant}{n}")
            await self._finish[n].wait()

    async def finish(self, *ns: int) -> None:
        for n in ns:
            self._finish[n].set()
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_one_tenant_alone_fills_the_batch_and_no_more():
    share = BatchShare(limit=4, protected_limit=2, most=8)
    h = Holder(share)
    ids = [h.submit("flood") for _ in range(6)]
    await settle()
    assert share.total == 4 and share.waiting == 2
    await h.finish(ids[0])
    await settle()
    assert share.total == 4 and share.waiting == 1
    await h.close()


@pytest.mark.asyncio
async def test_a_calm_tenant_starts_at_once_beside_a_full_batch_and_the_flood_drains_to_the_protected_size():
    share = BatchShare(limit=4, protected_limit=2, most=8)
    h = Holder(share)
    flood = [h.submit("flood") for _ in range(8)]
    await settle()
    assert share.running == {"flood": 4}
    calm = h.submit("calm")
    await settle()
    assert "calm8" in h.started and share.total == 5  # past the limit: below its share
    assert share.stats.protected_admissions == 1
    assert share.current_limit() == 2  # a tenant below its share has work: the flood drains
    await h.finish(*flood[:2])
    await settle()
    assert share.running["flood"] == 2  # nothing new for the flood while the batch is above 2
    await h.finish(flood[2])
    await settle()
    assert share.running["flood"] == 2  # back to 1, below its own share (4 // 2 tenants): it keeps that
    await h.finish(calm)
    await settle()
    assert share.current_limit() == 4 and share.running["flood"] == 4  # calm gone: the batch fills again
    await h.close()


@pytest.mark.asyncio
async def test_freed_places_go_to_the_tenant_with_fewest_running():
    share = BatchShare(limit=4, protected_limit=4, most=4)
    h = Holder(share)
    a = [h.submit("a") for _ in range(4)]
    await settle()
    b = [h.submit("b") for _ in range(2)]
    more_a = h.submit("a")
    await settle()
    assert share.total == 4 and share.waiting == 3  # `most` bounds even tenants below their share
    await h.finish(a[0])
    await settle()
    assert share.running == {"a": 3, "b": 1}
    await h.finish(a[1])
    await settle()
    assert share.running == {"a": 2, "b": 2}
    await h.finish(a[2])
    await settle()
    assert share.running == {"a": 2, "b": 2} and f"a{more_a}" in h.started
    del b
    await h.close()


@pytest.mark.asyncio
async def test_a_cancelled_waiter_leaves_no_trace_and_passes_no_place_twice():
    share = BatchShare(limit=1, protected_limit=1, most=1)
    h = Holder(share)
    first = h.submit("a")
    await settle()
    waiter = asyncio.create_task(_take(share, "a"))
    await settle()
    assert share.waiting == 1
    waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiter
    assert share.waiting == 0
    await h.finish(first)
    await settle()
    assert share.total == 0 and share.running == {}
    await h.close()


async def _take(share: BatchShare, tenant: str) -> None:
    async with share.slot(tenant):
        await asyncio.sleep(3600)


@pytest.mark.asyncio
async def test_a_calm_tenant_between_two_requests_keeps_the_batch_drained_for_linger_s():
    now = [0.0]
    share = BatchShare(limit=4, protected_limit=2, most=8, linger_s=3.0, clock=lambda: now[0])
    h = Holder(share)
    calm = h.submit("calm")
    flood = [h.submit("flood") for _ in range(6)]
    await settle()
    assert share.running == {"calm": 1, "flood": 2}  # as many as the lightest tenant, past the drained size
    await h.finish(calm)
    await settle()
    assert share.running["flood"] == 2  # calm done 0 s ago: still counts, the flood stays drained
    now[0] = 3.5
    await h.finish(flood[0])
    await settle()
    assert share.running["flood"] == 4  # calm gone for longer than linger_s: the flood has the batch
    await h.close()


@pytest.mark.asyncio
async def test_draining_hands_back_every_waiting_request_and_keeps_the_running_ones():
    share = BatchShare(limit=1, protected_limit=1, most=1)
    h = Holder(share)
    running = h.submit("a")
    await settle()
    waiters = [asyncio.create_task(_take(share, "a")) for _ in range(2)]
    await settle()
    assert share.hand_back_waiting() == 2
    for waiter in waiters:
        with pytest.raises(HandedBack):
            await waiter
    assert share.waiting == 0 and share.running == {"a": 1}
    await h.finish(running)
    await settle()
    assert share.total == 0
    await h.close()
