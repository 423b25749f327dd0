"""Engine-queued admission (the default): every request goes to the engine at once, and vLLM's
scheduler queues and batches what fits its `max_loras` slots, as `vllm serve` does. The worker only
steps in against starvation.

vLLM schedules waiting requests first come first served, skipping one whose adapter finds no free slot,
while new requests of the adapters holding slots join their running batch at once. So an adapter with a
steady stream of requests can keep its slot for ever and starve a request of another adapter waiting
behind it. The guard: once an adapter request has waited in the engine `max_wait_s` without its first
token, newcomers of other adapters are held in the worker until every such aged request has started; the
slot holders then run dry and vLLM hands the freed slot to the oldest waiting request. A request thus
waits at most `max_wait_s` plus the generations in the way. Base-model requests need no slot and are
never held. Measured against holding requests outside the engine grouped by adapter (`grouped`) in
benchmarks/bench_vs_vllm.py: see the README's serving-path section.

Hand-written: a small policy over asyncio futures, not a mechanism a library offers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from services.worker.admission import AdmissionStats


@dataclass
class Ticket:
    """A request's place: how long the worker held it, and what to call at its first token."""

    waited: float
    started: Callable[[], None] = field(default=lambda: None, repr=False)


@dataclass
class _Held:
    key: str
    since: float
    future: asyncio.Future = field(repr=False)


class EngineAdmission:
    def __init__(self, max_wait_s: float, clock=time.monotonic) -> None:
        self.max_wait_s = max_wait_s
        self.stats = AdmissionStats()
        self._clock = clock
        self._unstarted: dict[int, tuple[str, float]] = {}  # ticket -> (adapter, arrived), in the engine
        self._held: deque[_Held] = deque()
        self._ids = itertools.count()

    # --- public --------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def admitted(self, key: str | None) -> AsyncIterator[Ticket]:
        """A place in the engine for one request of adapter `key` (None: base model)."""
        if key is None:
            yield Ticket(0.0)
            return
        arrived = self._clock()
        if self._must_hold(key):
            await self._hold(key, arrived)
        waited = self._clock() - arrived
        ticket = next(self._ids)
        self._unstarted[ticket] = (key, arrived)
        self.stats.admitted += 1
        self.stats.longest_wait_s = max(self.stats.longest_wait_s, waited)
        try:
            yield Ticket(waited, lambda: self._started(ticket))
        finally:
            self._started(ticket)

    @property
    def waiting(self) -> int:
        """Requests the guard holds in the worker now."""
        return len(self._held)

    def oldest_wait_s(self) -> float:
        """How long the oldest adapter request without a first token has waited (held or in the engine)."""
        now = self._clock()
        arrivals = [since for _, since in self._unstarted.values()] + [h.since for h in self._held]
        return max((now - since for since in arrivals), default=0.0)

    # --- the guard -----------------------------------------------------------------------------
    def _aged(self) -> set[str]:
        now = self._clock()
        return {key for key, since in self._unstarted.values() if now - since >= self.max_wait_s}

    def _must_hold(self, key: str) -> bool:
        if self._held:  # keep arrival order behind those already held
            return True
        aged = self._aged()
        return bool(aged) and key not in aged

    async def _hold(self, key: str, arrived: float) -> None:
        held = _Held(key, arrived, asyncio.get_running_loop().create_future())
        self._held.append(held)
        self.stats.aged_admissions += 1  # a newcomer held back for an aged request
        try:
            await held.future
        except asyncio.CancelledError:
            if held in self._held:
                self._held.remove(held)
            raise

    def _started(self, ticket: int) -> None:
        if self._unstarted.pop(ticket, None) is not None:
            self._release()

    def _release(self) -> None:
        """Let the held requests in, in order, while nothing aged is waiting for a slot."""
        while self._held:
            aged = self._aged()
            if aged and self._held[0].key not in aged:
                return
            held = self._held.popleft()
            if not held.future.done():
                held.future.set_result(None)
