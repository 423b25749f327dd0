"""The one JetStream pull loop of every work queue: the gateway's submissions, the worker's requests,
the trainer's jobs and the eval gate's events.

A service says how much room it has (`room`) and what to do with what arrived (`deliver`); the loop
fetches, survives the broker going away (one log line per change of state, never a traceback per
failed fetch) and stops with the service. Why hand-written rather than FastStream's `PullSub`: see
`libs.bus` (measured in `benchmarks/bench_consumer.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential

from libs.bus.retry import is_transient
from libs.bus.state import ConnectionState

log = logging.getLogger(__name__)

FOLLOW_UP_S = 0.01  # the longest a pull inside a burst waits when nothing else is stored

Room = Callable[[], Awaitable[int]]
Deliver = Callable[[list], Awaitable[None]]


class PullConsumer:
    """Pull from a durable consumer while the service runs: wait for room, fetch what arrived, deliver."""

    def __init__(
        self,
        sub,
        name: str,
        *,
        room: Room,
        deliver: Deliver,
        poll_s: float = 1.0,
        max_batch: int = 16,
        after_failure: Callable[[], Awaitable[None]] | None = None,
        gather_s: float | None = None,
    ) -> None:
        self.sub = sub
        # Set: once a message arrives, what else arrives within gather_s (up to `room`) is delivered with it,
        # for a consumer that would rather handle fewer, bigger deliveries than each message the moment it is
        # stored (usage metering, one transaction per delivery: results a few ms apart came one per
        # transaction). Idle pulls stay one long poll per poll_s.
        self.gather_s = gather_s
        self.room = room
        self.deliver = deliver
        self.poll_s = poll_s
        self.max_batch = max_batch
        self.after_failure = after_failure
        self.state = ConnectionState(f"work queue ({name})")
        self.pulled = 0

    async def run(self, stopping: asyncio.Event | None = None) -> None:
        stopping = stopping or asyncio.Event()
        in_burst = False  # the last pull found messages: more of the same burst may be stored
        while not stopping.is_set():
            room = max(1, min(self.max_batch, await self.room()))
            try:
                msgs = await self._pull(room, in_burst)
            except (TimeoutError, NatsTimeout):
                self.state.ok()
                in_burst = False
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the broker is away, or the consumer was deleted under us
                self.state.failed(exc)
                in_burst = False
                await asyncio.sleep(0.5)
                if self.after_failure is not None:
                    await self.after_failure()
                continue
            self.state.ok()
            in_burst = True
            self.pulled += len(msgs)
            await self.deliver(msgs)

    async def _pull(self, room: int, in_burst: bool) -> list:
        """Idle: a long poll for ONE message, handed over the moment it arrives. Not `fetch(batch=room)`:
        once its long poll gets a first message, nats-py waits for the rest of the batch until the poll
        expires, so a request arriving at an idle consumer sat up to `poll_s` in the client (the TTFT
        gap to `vllm serve` once). In a burst: whatever else is stored, up to `room`, waiting at most
        `FOLLOW_UP_S` (with nothing stored the burst is over and the next pull is a long poll again).
        With `gather_s`: the first message and what follows it within gather_s, delivered together."""
        if in_burst:
            return await self.sub.fetch(batch=room, timeout=self.gather_s or FOLLOW_UP_S)
        first = await self.sub.fetch(batch=1, timeout=self.poll_s)
        if self.gather_s is None or room <= len(first):
            return first
        try:  # the rest of the burst that starts with this message
            return first + await self.sub.fetch(batch=room - len(first), timeout=self.gather_s)
        except Exception:  # nothing more came (or the broker went): what arrived is delivered all the same
            return first


def one_at_a_time(handle: Callable[[object], Awaitable[None]], retry_delay_s: float) -> tuple[Room, Deliver]:
    """`room` and `deliver` for a consumer that handles one message at a time, inline: an exception in
    `handle` is a transient failure, so the message is NAKed with a delay (redelivered)."""

    async def room() -> int:
        return 1

    async def deliver(msgs: list) -> None:
        for msg in msgs:
            try:
                await handle(msg)
            except Exception:
                log.exception("handling %s failed; it will be redelivered", msg.subject)
                with contextlib.suppress(Exception):
                    await msg.nak(delay=retry_delay_s)

    return room, deliver


async def durable_pull(link, stream: str, filter_subject: str, durable: str, **config):
    """A pull subscription on a durable consumer with explicit acks that redelivers for ever; the link
    re-creates the consumer after a reconnect if the broker lost it."""
    consumer = ConsumerConfig(
        durable_name=durable,
        ack_policy=AckPolicy.EXPLICIT,
        max_deliver=-1,
        filter_subject=filter_subject,
        **config,
    )
    link.add_consumer(stream, consumer)
    async for attempt in AsyncRetrying(  # a cluster still electing the stream's leader answers 503s
        retry=retry_if_exception(is_transient),
        stop=stop_after_delay(60),
        wait=wait_exponential(multiplier=0.2, max=3),
        reraise=True,
    ):
        with attempt:
            return await link.js.pull_subscribe(filter_subject, durable=durable, stream=stream, config=consumer)
    raise AssertionError("unreachable")  # pragma: no cover


@contextlib.asynccontextmanager
async def kept_in_progress(msg, ack_wait_s: float):
    """While the block runs, tell JetStream every ack_wait/3 that `msg` is still being worked on."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(max(1.0, ack_wait_s / 3))
            with contextlib.suppress(Exception):
                await msg.in_progress()

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
