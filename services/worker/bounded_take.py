"""Taking pulled messages: the worker's capacity, and the pool's load bound checked as it takes them.

The worker pulls from two consumers (its own subject, the pool's shared one) in two loops. Each loop
waits for room, fetches, and only then takes what arrived. With the pool's load bound on
(services/worker/load_bound.py), a loop keeps only what leaves the worker within the bound: its own
subject's extra messages are passed on to the pool, the pool's are handed back. The two loops check and
take one at a time: a check that waits on a pass-on publish must see what the other loop took meanwhile,
or both keep messages against the same room and the worker ends over the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from services.worker.load_bound import RETURN_DELAY_S, LoadBound, passed_on_headers, pool_subject

log = logging.getLogger(__name__)


class Capacity:
    """How many more requests the worker may take, shared by its two pull loops.

    A loop waits for free room, fetches at most that many, and only then takes what actually arrived:
    room is never held by a loop long-polling an empty consumer (which would starve the other loop).
    The two loops can together overshoot the limit by at most one batch, briefly.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._changed = asyncio.Condition()

    async def wait_for_room(self) -> int:
        async with self._changed:
            await self._changed.wait_for(lambda: self.used < self.limit)
            return self.limit - self.used

    def take(self, count: int) -> None:
        self.used += count

    async def give_back(self, count: int = 1) -> None:
        async with self._changed:
            self.used -= count
            self._changed.notify_all()


class BoundedTake:
    """What each pull loop keeps of the messages it fetched, taken from `capacity`.

    `in_flight` is the worker's exact load now; `publish` is JetStream's publish (for pass-ons). Without
    a bound (`bound` None) every message fetched is kept.
    """

    def __init__(
        self,
        capacity: Capacity,
        bound: LoadBound | None,
        *,
        me: str,
        pool: str,
        in_flight: Callable[[], int],
        publish: Callable[..., Awaitable],
    ) -> None:
        self.capacity = capacity
        self.bound = bound
        self.me = me
        self.pool = pool
        self._in_flight = in_flight
        self._publish = publish
        self._checks = asyncio.Lock()

    async def room(self, loop: str) -> int:
        """How many the loop may fetch: free capacity, and for the pool's loop only what keeps this worker
        within the bound."""
        free = await self.capacity.wait_for_room()
        if loop == "pool" and self.bound is not None:
            free = await self.bound.wait_for_room(self._in_flight, free)
        return free

    async def take(self, loop: str, msgs: list) -> list:
        """The messages this worker keeps (taken from capacity); the others are passed on or handed back."""
        if self.bound is None:
            self.capacity.take(len(msgs))
            return msgs
        async with self._checks:
            kept = await (self._within_bound_own(msgs) if loop == "own" else self._within_bound_pool(msgs))
            self.capacity.take(len(kept))
            return kept

    async def _within_bound_own(self, msgs: list) -> list:
        """Of its own subject's messages, those over the pool's bound go to the pool's shared subject."""
        kept = []
        for msg in msgs:
            if not (self.bound.over(self._in_flight() + len(kept)) and await self._pass_on(msg)):
                kept.append(msg)
        return kept

    async def _within_bound_pool(self, msgs: list) -> list:
        """Of the pool's messages, one over the bound (the own subject filled the worker while this pull
        waited) goes back to the pool's consumer, until it came back too often."""
        kept = []
        for msg in msgs:
            deliveries = getattr(getattr(msg, "metadata", None), "num_delivered", 1) or 1
            if self.bound.over(self._in_flight() + len(kept)) and not self.bound.keep_returned(deliveries):
                with contextlib.suppress(Exception):  # not handed back: redelivered after ack_wait
                    await msg.nak(delay=RETURN_DELAY_S)
                continue
            kept.append(msg)
        return kept

    async def _pass_on(self, msg) -> bool:
        """Publish to the pool's shared subject, then ack: false (keep it here) when the publish fails."""
        started = time.perf_counter()
        try:
            await self._publish(pool_subject(self.pool, msg), msg.data, headers=passed_on_headers(msg, self.me))
        except Exception as exc:
            log.warning("could not pass a message on over the load bound (%s); kept", type(exc).__name__)
            return False
        with contextlib.suppress(Exception):  # not acked: redelivered here, and its copy is stored once
            await msg.ack()
        self.bound.passed_on(time.perf_counter() - started)
        return True
