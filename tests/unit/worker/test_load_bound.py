"""The worker's own check of the pool's load bound (services/worker/load_bound.py): keep within the
bound, over it pass on (own subject) or hand back (pool subject), and pull the pool only within it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from opentelemetry.sdk.metrics import MeterProvider

from libs.contracts import WorkerLoad, subjects
from libs.routing import load_bound
from services.worker.load_bound import MAX_RETURNS, LoadBound, passed_on_headers, pool_subject

C = 1.25


NOW = 1000.0


def bound_for(me: str, members: list[str], loads: dict[str, int]) -> LoadBound:
    """`members` have reported (0 unless `loads` says otherwise), just now."""
    guard = LoadBound(me, C, MeterProvider().get_meter("test"), staleness_s=10.0)
    guard.pool._clock = lambda: NOW
    for worker in members:
        if worker != me:
            guard.pool.reported(worker, loads.get(worker, 0), ts=NOW - 1)
    return guard


def test_within_the_bound_it_stays_over_it_it_goes():
    guard = bound_for("a", ["a", "b"], {"b": 3})
    # m = 2 + 3 = 5 over 2 workers: ceil(1.25 * 6 / 2) = 4, and a would hold 3
    assert guard.bound(2) == load_bound(5, 2, C) == 4
    assert not guard.over(2)
    assert not guard.over(6)  # m = 9: ceil(1.25 * 10 / 2) = 7, and a would hold 7
    assert guard.over(7)  # m = 10: ceil(1.25 * 11 / 2) = 7 < 8


def test_room_is_what_keeps_the_worker_within_the_bound():
    guard = bound_for("a", ["a", "b", "c"], {"b": 4, "c": 4})
    free = guard.room(0, most=50)
    assert free > 0
    assert not guard.over(free - 1) and guard.over(free)
    assert guard.room(0, most=2) == 2  # never more than the capacity leaves
    assert guard.room(free, most=50) == 0


async def test_waiting_for_room_ends_when_another_worker_reports_less():
    guard = bound_for("a", ["a", "b"], {"b": 0})
    own = 5  # over: ceil(1.25 * 6 / 2) = 4 < 6
    assert guard.room(own, most=8) == 0
    waiter = asyncio.create_task(guard.wait_for_room(lambda: own, 8, poll_s=0.01))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    guard.pool.reported("b", 6, ts=NOW)  # the others filled up: the bound grew (m = 11: ceil(15 / 2) = 8)
    assert await asyncio.wait_for(waiter, 1.0) >= 1


def test_alone_in_the_pool_it_keeps_everything():
    guard = bound_for("a", ["a"], {})
    assert not guard.over(50) and guard.room(50, most=8) == 8


def test_a_returned_pool_message_is_kept_after_too_many_returns():
    guard = bound_for("a", ["a", "b"], {})
    assert not guard.keep_returned(1)
    assert not guard.keep_returned(MAX_RETURNS)
    assert guard.keep_returned(MAX_RETURNS + 1) and guard.kept_over == 1


def test_older_load_reports_do_not_overwrite_newer_ones():
    guard = bound_for("a", ["a", "b"], {})
    guard.pool.reported("b", 5, ts=NOW)
    guard.pool.reported("b", 1, ts=NOW - 0.5)
    assert guard.pool.load("b") == 5


async def test_load_messages_update_the_others_and_garbage_is_ignored():
    guard = bound_for("a", ["a", "b"], {})
    for worker, in_flight in (("b", 7), ("a", 99)):
        load = WorkerLoad(worker_id=worker, pool="p", in_flight=in_flight, ts=NOW)
        await guard.on_load(SimpleNamespace(data=load.model_dump_json()))
    await guard.on_load(SimpleNamespace(data=b"{not json"))
    assert guard.pool.load("b") == 7 and guard.pool.load("a") == 0


def test_members_are_the_workers_heard_from_lately_and_always_this_one():
    guard = bound_for("a", ["a", "b", "c"], {"b": 2, "c": 4})
    assert guard.pool.members == ("a", "b", "c")
    guard.pool._clock = lambda: NOW + 9.5  # c reports again, b has been silent for 10.5 s: gone
    guard.pool.reported("c", 4, ts=NOW + 9.0)
    assert guard.pool.members == ("a", "c")
    assert guard.bound(0) == load_bound(4, 2, C)  # b's load no longer counted
    guard.pool._clock = lambda: NOW + 60
    assert guard.pool.members == ("a",)


def test_a_passed_on_message_keeps_its_headers_and_gets_its_own_id_on_the_pool_subject():
    msg = SimpleNamespace(
        headers={"Nats-Msg-Id": "r1@gw", "traceparent": "00-abc"}, reply="$JS.ACK.x", subject="lpx.infer.p.w.tok"
    )
    headers = passed_on_headers(msg, "a")
    assert headers["traceparent"] == "00-abc" and headers["Nats-Msg-Id"] == "r1@gw-bound-a"
    assert passed_on_headers(msg, "a") == headers  # a redelivery passed on again: the same id (stored once)
    assert pool_subject("p", msg) == subjects.infer_any("p", "tok")


class _Msg:
    def __init__(self, n: int) -> None:
        self.data, self.headers, self.reply = b"{}", {"Nats-Msg-Id": f"m{n}"}, f"r{n}"
        self.subject = "lpx.infer.p.w.a.tok"
        self.metadata = SimpleNamespace(num_delivered=1)
        self.naked = False

    async def ack(self) -> None:
        pass

    async def nak(self, delay: float = 0) -> None:
        self.naked = True


async def test_the_two_pull_loops_check_the_bound_one_at_a_time():
    """The own loop passes a message on (a publish: it waits) after keeping two; the pool loop's check
    must see those two taken, or the worker ends over the bound (the race behind violations at the worker)."""
    from services.worker.bounded_take import BoundedTake, Capacity

    async def slow_publish(*args, **kwargs) -> None:
        await asyncio.sleep(0.05)

    capacity = Capacity(16)
    bound = bound_for("a", ["a", "b"], {"b": 0})  # a may hold 2: ceil(1.25 * 3 / 2) = 2
    take = BoundedTake(capacity, bound, me="a", pool="p", in_flight=lambda: capacity.used, publish=slow_publish)
    late = _Msg(9)
    own, pool = await asyncio.gather(take.take("own", [_Msg(1), _Msg(2), _Msg(3)]), take.take("pool", [late]))
    assert capacity.used == len(own) + len(pool) == 2  # within the bound
    assert late.naked and bound.handed_on == 1 and pool == []


async def test_without_a_bound_every_message_fetched_is_kept():
    from services.worker.bounded_take import BoundedTake, Capacity

    capacity = Capacity(4)
    take = BoundedTake(capacity, None, me="a", pool="p", in_flight=lambda: capacity.used, publish=None)
    msgs = [_Msg(1), _Msg(2)]
    assert await take.take("own", msgs) == msgs and capacity.used == 2
    assert await take.room("pool") == 2
