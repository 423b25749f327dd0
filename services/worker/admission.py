"""Adapter-aware admission: which waiting requests the worker hands to the engine next.

The engine batches at most `max_loras` distinct adapters at once. When the requests in hand need more
adapters than that, handing them all to the engine makes it swap adapters into slots in arrival order
(vLLM's scheduler skips a request whose adapter does not fit and retries it every step), so a slot can
change hands for every request. Here the worker admits requests grouped by adapter instead:

- an adapter holding a slot admits its new requests at once (they batch with its running ones);
- a freed slot goes to the waiting adapter with the most requests waiting, so a swap serves a group;
- aging bound: once any request has waited `max_wait_s`, its adapter is next, and adapters already
  holding a slot stop admitting newcomers until it has one: a request waits at most `max_wait_s` plus
  the generations in the way (those running, and those of adapters that aged before it): starvation-free;
- base-model requests (no adapter) never wait here: they need no slot.

Hand-written: it is a small scheduling policy over asyncio futures, not a mechanism a library offers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


@dataclass
class _Waiter:
    key: str
    since: float
    future: asyncio.Future = field(repr=False)


@dataclass
class AdmissionStats:
    slot_swaps: int = 0  # a slot given to an adapter that did not hold one
    admitted: int = 0
    longest_wait_s: float = 0.0  # since start
    aged_admissions: int = 0  # slots handed out because the aging bound was hit


class AdapterAdmission:
    def __init__(self, slots: int, max_wait_s: float, clock=time.monotonic) -> None:
        if slots < 1:
            raise ValueError("admission needs at least one adapter slot")
        self.slots = slots
        self.max_wait_s = max_wait_s
        self.stats = AdmissionStats()
        self._clock = clock
        self._running: dict[str, int] = {}  # adapter -> requests admitted and not finished
        self._waiting: dict[str, deque[_Waiter]] = {}

    # --- public --------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def admitted(self, key: str | None) -> AsyncIterator[float]:
        """Hold a place for one request of adapter `key` (None: base model); yields the wait in seconds."""
        if key is None:
            yield 0.0
            return
        waited = await self._enter(key)
        try:
            yield waited
        finally:
            self._leave(key)

    @property
    def waiting(self) -> int:
        return sum(len(queue) for queue in self._waiting.values())

    @property
    def adapters_running(self) -> int:
        return len(self._running)

    def oldest_wait_s(self) -> float:
        now = self._clock()
        return max((now - queue[0].since for queue in self._waiting.values() if queue), default=0.0)

    # --- admission -----------------------------------------------------------------------------
    async def _enter(self, key: str) -> float:
        if self._may_join(key):
            self._admit(key, waited=0.0)
            return 0.0
        waiter = _Waiter(key, self._clock(), asyncio.get_running_loop().create_future())
        self._waiting.setdefault(key, deque()).append(waiter)
        try:
            return await waiter.future
        except asyncio.CancelledError:
            self._forget(waiter)
            raise

    def _may_join(self, key: str) -> bool:
        if self._waiting.get(key):  # keep arrival order within an adapter
            return False
        if key in self._running:
            return not self._someone_aged(other_than=key)
        return len(self._running) < self.slots and not self._someone_aged(other_than=key)

    def _someone_aged(self, other_than: str) -> bool:
        now = self._clock()
        return any(
            queue and now - queue[0].since >= self.max_wait_s
            for key, queue in self._waiting.items()
            if key != other_than
        )

    def _admit(self, key: str, waited: float) -> None:
        if key not in self._running:
            self.stats.slot_swaps += 1
            self._running[key] = 0
        self._running[key] += 1
        self.stats.admitted += 1
        self.stats.longest_wait_s = max(self.stats.longest_wait_s, waited)

    def _leave(self, key: str) -> None:
        self._running[key] -= 1
        if self._running[key] == 0:
            del self._running[key]
        self._dispatch()

    def _forget(self, waiter: _Waiter) -> None:
        queue = self._waiting.get(waiter.key)
        if queue and waiter in queue:
            queue.remove(waiter)
        if queue is not None and not queue:
            del self._waiting[waiter.key]
        if waiter.future.done() and not waiter.future.cancelled():  # admitted just before the cancel
            self._leave(waiter.key)

    def _dispatch(self) -> None:
        """Wake whoever may run now: adapters with a slot, then freed slots by policy."""
        for key in list(self._running):
            if key in self._waiting and not self._someone_aged(other_than=key):
                self._admit_group(key)
        while len(self._running) < self.slots and self._waiting:
            self._admit_group(self._next_adapter())

    def _next_adapter(self) -> str:
        now = self._clock()
        waiting = self._waiting.items()
        aged = [(queue[0].since, key) for key, queue in waiting if now - queue[0].since >= self.max_wait_s]
        if aged:
            self.stats.aged_admissions += 1
            return min(aged)[1]
        # The biggest group first (one swap serves the most requests); ties: the oldest first.
        return max(self._waiting, key=lambda key: (len(self._waiting[key]), -self._waiting[key][0].since))

    def _admit_group(self, key: str) -> None:
        queue = self._waiting.pop(key)
        now = self._clock()
        for waiter in queue:
            if waiter.future.done():
                continue
            waited = now - waiter.since
            self._admit(key, waited)
            waiter.future.set_result(waited)
