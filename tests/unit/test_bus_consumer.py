"""libs.bus.consumer, the one pull loop, against a scripted subscription (the real broker paths are
covered by the worker, gateway, trainer and eval-gate suites, the broker-outage and chaos suites)."""

from __future__ import annotations

import asyncio
import logging

from nats.errors import TimeoutError as NatsTimeout

from libs.bus.consumer import FOLLOW_UP_S, PullConsumer, kept_in_progress, one_at_a_time


class Msg:
    def __init__(self, n: int) -> None:
        self.subject = f"lpx.t.{n}"
        self.naked: list[float] = []
        self.beats = 0

    async def nak(self, delay: float) -> None:
        self.naked.append(delay)

    async def in_progress(self) -> None:
        self.beats += 1


class ScriptedSub:
    """Answers each fetch from a script: a list of messages, or an exception to raise."""

    def __init__(self, script: list) -> None:
        self.script = list(script)
        self.calls: list[tuple[int, float]] = []

    async def fetch(self, batch: int, timeout: float) -> list:
        self.calls.append((batch, timeout))
        if not self.script:
            await asyncio.sleep(0.01)
            raise NatsTimeout
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        return step[:batch]


async def run_briefly(consumer: PullConsumer, seconds: float = 0.3) -> None:
    stopping = asyncio.Event()
    task = asyncio.create_task(consumer.run(stopping))
    await asyncio.sleep(seconds)
    stopping.set()
    await asyncio.wait_for(task, 2)


async def test_idle_pulls_one_at_a_time_and_a_burst_takes_what_is_stored_up_to_the_room():
    msgs = [Msg(i) for i in range(6)]
    sub = ScriptedSub([msgs[:1], msgs[1:6]])
    delivered: list[Msg] = []

    async def room() -> int:
        return 4

    async def deliver(batch: list) -> None:
        delivered.extend(batch)

    await run_briefly(PullConsumer(sub, "t", room=room, deliver=deliver, poll_s=0.5))
    # idle: a long poll for one message (handed over at once, never held for a batch to fill);
    # then the burst's follow-ups, short and up to the room; then a long poll again
    assert sub.calls[:3] == [(1, 0.5), (4, FOLLOW_UP_S), (4, FOLLOW_UP_S)]
    assert sub.calls[3] == (1, 0.5)
    assert delivered == msgs[:5]


async def test_a_gathering_consumer_delivers_a_first_message_with_what_follows_it_in_one_delivery():
    msgs = [Msg(i) for i in range(6)]
    sub = ScriptedSub([msgs[:1], msgs[1:4], msgs[4:6]])
    deliveries: list[list[Msg]] = []

    async def room() -> int:
        return 8

    async def deliver(batch: list) -> None:
        deliveries.append(list(batch))

    await run_briefly(PullConsumer(sub, "usage", room=room, deliver=deliver, poll_s=0.5, gather_s=0.05))
    # idle stays one long poll for one message; then the rest of its burst within gather_s, room permitting
    assert sub.calls[:3] == [(1, 0.5), (7, 0.05), (8, 0.05)]
    assert deliveries[:2] == [msgs[:4], msgs[4:6]]


async def test_room_bounds_every_pull_and_everything_is_delivered_once():
    msgs = [Msg(i) for i in range(10)]
    sub = ScriptedSub([msgs[:1], msgs[1:3], msgs[3:4], msgs[4:]])
    delivered: list[Msg] = []

    async def room() -> int:
        return 3

    async def deliver(batch: list) -> None:
        delivered.extend(batch)

    await run_briefly(PullConsumer(sub, "t", room=room, deliver=deliver, max_batch=16))
    assert all(batch <= 3 for batch, _ in sub.calls)
    assert len(delivered) == len({id(m) for m in delivered})


async def test_a_failing_fetch_is_one_log_line_then_recovery_and_the_failure_hook(caplog):
    caplog.set_level(logging.INFO, logger="libs.bus")
    boom = ConnectionError("broker away")
    sub = ScriptedSub([boom, boom, boom, [Msg(0)]])
    delivered: list[Msg] = []
    hooks = []

    async def room() -> int:
        return 1

    async def deliver(batch: list) -> None:
        delivered.extend(batch)

    async def after_failure() -> None:
        hooks.append(1)

    consumer = PullConsumer(sub, "t", room=room, deliver=deliver, after_failure=after_failure)
    await run_briefly(consumer, 2.0)
    assert len(delivered) == 1 and len(hooks) == 3
    lines = [r.getMessage() for r in caplog.records if r.name == "libs.bus"]
    assert sum("unavailable" in line for line in lines) == 1, lines
    assert sum("back after" in line for line in lines) == 1, lines


async def test_one_at_a_time_naks_a_failed_message_with_the_delay_and_goes_on():
    handled = []

    async def handle(msg) -> None:
        if msg.subject.endswith(".1"):
            raise RuntimeError("transient")
        handled.append(msg.subject)

    room, deliver = one_at_a_time(handle, retry_delay_s=7.0)
    assert await room() == 1
    msgs = [Msg(0), Msg(1), Msg(2)]
    await deliver(msgs)
    assert handled == ["lpx.t.0", "lpx.t.2"]
    assert msgs[1].naked == [7.0] and msgs[0].naked == []


async def test_kept_in_progress_beats_while_the_block_runs(monkeypatch):
    real_sleep = asyncio.sleep

    async def fast_sleep(seconds: float) -> None:
        await real_sleep(0.01 if seconds >= 1.0 else seconds)

    monkeypatch.setattr(asyncio, "sleep", fast_sleep)
    msg = Msg(0)
    async with kept_in_progress(msg, ack_wait_s=30):
        await real_sleep(0.1)
    beats = msg.beats
    assert beats >= 2
    await real_sleep(0.05)
    assert msg.beats == beats  # stopped with the block
