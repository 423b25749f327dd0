"""Fair share of a full pool (services/gateway/fairness.py): straight through while there is room;
once full, freed places go round robin across tenants (weights), interactive before batch; waiters
whose deadline passes get 504 and leave no trace."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.gateway.errors import GatewayError
from services.gateway.fairness import BATCH, INTERACTIVE, FairQueue


class Pool:
    def __init__(self, capacity: int) -> None:
        self.capacity, self.load = capacity, 0

    def room(self, _pool: str) -> tuple[int, int]:
        return self.load, self.capacity


async def grant_order(fair: FairQueue, pool: Pool, arrivals: list[tuple[str, str]], frees: int) -> list[str]:
    """Queue `arrivals` (tenant, tier) on a full pool, then free `frees` places one by one."""
    order: list[str] = []

    async def one(tenant: str, tier: str) -> None:
        await fair.acquire("p", tenant, tier, deadline=time.time() + 30)
        order.append(tenant)
        pool.load += 1  # dispatched: now in the load signal
        fair.dispatched("p")

    tasks = []
    for tenant, tier in arrivals:
        tasks.append(asyncio.create_task(one(tenant, tier)))
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)
    for _ in range(frees):
        pool.load -= 1
        fair.kick("p")
        await asyncio.sleep(0.01)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return order


async def test_with_room_requests_go_straight_through():
    pool = Pool(capacity=4)
    fair = FairQueue(pool.room, headroom=1.0)
    for _ in range(4):
        await asyncio.wait_for(fair.acquire("p", "a", INTERACTIVE, None), 0.1)
        pool.load += 1
        fair.dispatched("p")
    assert fair.waiting("p") == 0


async def test_a_flooding_tenant_waits_behind_itself_not_in_front_of_the_others():
    pool = Pool(capacity=2)
    pool.load = 2  # full
    fair = FairQueue(pool.room, headroom=1.0)
    arrivals = [("flood", INTERACTIVE)] * 10 + [("calm", INTERACTIVE), ("other", INTERACTIVE)]
    order = await grant_order(fair, pool, arrivals, frees=6)
    # FIFO would serve 10 flood requests first; round robin serves calm and other within the first 3.
    assert order[:3].count("flood") == 1 and {"calm", "other"} <= set(order[:3])
    assert order[3:] == ["flood"] * 3  # and then flood gets every place nobody else wants


async def test_weights_share_places_in_proportion():
    pool = Pool(capacity=1)
    pool.load = 1
    weights = {"heavy": 3.0, "light": 1.0}
    fair = FairQueue(pool.room, headroom=1.0, weight_of=weights.get)
    arrivals = [("heavy", INTERACTIVE)] * 12 + [("light", INTERACTIVE)] * 12
    order = await grant_order(fair, pool, arrivals, frees=16)
    assert order.count("heavy") == 12 and order.count("light") == 4


async def test_interactive_requests_go_before_batch_work():
    pool = Pool(capacity=1)
    pool.load = 1
    fair = FairQueue(pool.room, headroom=1.0)
    arrivals = [("batchy", BATCH)] * 5 + [("chat", INTERACTIVE)] * 2
    order = await grant_order(fair, pool, arrivals, frees=4)
    assert order == ["chat", "chat", "batchy", "batchy"]


async def test_a_waiter_whose_deadline_passes_gets_504_and_leaves_no_trace():
    pool = Pool(capacity=1)
    pool.load = 1
    fair = FairQueue(pool.room, headroom=1.0)
    with pytest.raises(GatewayError) as caught:
        await fair.acquire("p", "a", INTERACTIVE, deadline=time.time() + 0.05)
    assert caught.value.status == 504
    assert fair.waiting("p") == 0
    pool.load = 0
    await asyncio.wait_for(fair.acquire("p", "b", INTERACTIVE, None), 0.1)  # nothing stuck in front


async def test_a_cancelled_waiter_gives_its_place_to_the_next():
    pool = Pool(capacity=1)
    pool.load = 1
    fair = FairQueue(pool.room, headroom=1.0)
    gone = asyncio.create_task(fair.acquire("p", "a", INTERACTIVE, None))
    stays = asyncio.create_task(fair.acquire("p", "b", INTERACTIVE, None))
    await asyncio.sleep(0.01)
    gone.cancel()
    await asyncio.sleep(0.01)
    pool.load = 0
    fair.kick("p")
    await asyncio.wait_for(stays, 0.1)
    assert fair.waiting("p") == 0


async def test_ahead_counts_rounds_of_the_waiting_tenants():
    pool = Pool(capacity=1)
    pool.load = 1
    fair = FairQueue(pool.room, headroom=1.0)
    assert fair.ahead("p", "calm") == 0
    tasks = [asyncio.create_task(fair.acquire("p", "flood", INTERACTIVE, None)) for _ in range(5)]
    await asyncio.sleep(0.01)
    assert fair.ahead("p", "calm") == 1  # one flood request, then calm's turn
    assert fair.ahead("p", "flood") == 5  # behind its own five
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_the_snapshot_shows_who_waits_how_long_and_their_share():
    pool = Pool(capacity=1)
    pool.load = 1
    weights = {"heavy": 3.0}
    fair = FairQueue(pool.room, headroom=1.0, weight_of=lambda t: weights.get(t, 1.0))
    assert fair.snapshot() == []
    tasks = [asyncio.create_task(fair.acquire("p", t, BATCH, None)) for t in ("heavy", "heavy", "light")]
    await asyncio.sleep(0.05)
    rows = {row.tenant: row for row in fair.snapshot()}
    assert rows["heavy"].waiting == 2 and rows["light"].waiting == 1
    assert rows["heavy"].share == pytest.approx(0.75) and rows["light"].share == pytest.approx(0.25)
    assert rows["light"].oldest_wait_s >= 0.04 and rows["light"].pool == "p"
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert fair.snapshot() == []  # cancelled waiters are not shown


async def test_acquire_says_whether_it_waited():
    pool = Pool(capacity=1)
    fair = FairQueue(pool.room, headroom=1.0)
    assert await fair.acquire("p", "a", INTERACTIVE, None) is False  # room: straight through
    pool.load = 1
    waiting = asyncio.create_task(fair.acquire("p", "a", INTERACTIVE, None))
    await asyncio.sleep(0.01)
    pool.load = 0
    fair.dispatched("p")
    assert await asyncio.wait_for(waiting, 1) is True


async def test_batch_work_leaves_a_reserve_that_interactive_requests_use_at_once():
    pool = Pool(capacity=8)
    fair = FairQueue(pool.room, headroom=1.25, batch_reserve=0.25)  # batch may fill 6 of 8
    assert fair.batch_limit(8) == 6 and fair.batch_limit(1) == 1  # always at least one
    for _ in range(6):
        assert await fair.acquire("p", "batch", BATCH, None) is False
        pool.load += 1
        fair.dispatched("p")
    waiting_batch = asyncio.create_task(fair.acquire("p", "batch", BATCH, None))
    await asyncio.sleep(0.01)
    assert not waiting_batch.done()  # the reserve is not batch work's
    # an interactive request does not queue behind the waiting batch work: straight into the reserve
    assert await asyncio.wait_for(fair.acquire("p", "chat", INTERACTIVE, None), 0.1) is False
    pool.load += 1
    fair.dispatched("p")
    pool.load -= 2  # two batch requests finish: one place under the batch limit again
    fair.kick("p")
    assert await asyncio.wait_for(waiting_batch, 0.1) is True


async def test_without_a_reserve_batch_fills_the_capacity_but_never_the_headroom():
    pool = Pool(capacity=4)
    fair = FairQueue(pool.room, headroom=2.0)
    for _ in range(4):
        await fair.acquire("p", "batch", BATCH, None)
        pool.load += 1
        fair.dispatched("p")
    blocked = asyncio.create_task(fair.acquire("p", "batch", BATCH, None))
    await asyncio.sleep(0.01)
    assert not blocked.done()  # batch never queues on the workers
    assert await fair.acquire("p", "chat", INTERACTIVE, None) is False  # interactive may, up to the headroom
    blocked.cancel()
    await asyncio.gather(blocked, return_exceptions=True)


async def test_the_gauges_show_a_waiting_tenant_and_its_oldest_wait():
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from services.gateway.metrics import GatewayMetrics

    reader = InMemoryMetricReader()
    metrics = GatewayMetrics.create(MeterProvider(metric_readers=[reader]).get_meter("t"))
    pool = Pool(capacity=1)
    pool.load = 1
    fair = FairQueue(pool.room, headroom=1.0)
    metrics.observe_fair_queue(fair)
    task = asyncio.create_task(fair.acquire("p", "starved", INTERACTIVE, None))
    await asyncio.sleep(0.05)
    points = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    points[(metric.name, point.attributes.get("tenant"))] = point.value
    assert points[("lpx_gateway_fair_waiting", "starved")] == 1
    assert points[("lpx_gateway_fair_oldest_wait", "starved")] >= 0.04
    assert points[("lpx_gateway_fair_share", "starved")] == 1.0
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_tenant_below_its_share_goes_on_through_a_pool_the_flood_filled():
    pool = Pool(capacity=4)
    held = {"p": {"flood": 5}}  # the flood holds the whole pool (and its headroom)
    fair = FairQueue(pool.room, headroom=1.25, held=held.__getitem__)
    pool.load = 5
    flood_waits = asyncio.create_task(fair.acquire("p", "flood", INTERACTIVE, None))
    await asyncio.sleep(0.01)
    assert not flood_waits.done()  # over its share: it waits for a freed place
    assert await asyncio.wait_for(fair.acquire("p", "calm", INTERACTIVE, None), 0.1) is False  # at once
    held["p"]["calm"] = 2
    fair.dispatched("p")
    pool.load = 7
    calm_again = asyncio.create_task(fair.acquire("p", "calm", INTERACTIVE, None))
    await asyncio.sleep(0.01)
    assert not calm_again.done()  # at its share (4 // 2 tenants): it waits its turn like everyone
    assert not await _acquired(fair, "batchy", BATCH)  # batch work never takes the shortcut
    for task in (flood_waits, calm_again):
        task.cancel()
    await asyncio.gather(flood_waits, calm_again, return_exceptions=True)


async def _acquired(fair: FairQueue, tenant: str, tier: str) -> bool:
    try:
        await asyncio.wait_for(fair.acquire("p", tenant, tier, None), 0.05)
    except TimeoutError:
        return False
    return True
