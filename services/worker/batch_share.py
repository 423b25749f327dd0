"""Who runs in the engine's batch now: each tenant's fair share of the worker's sequences, and a batch
kept small enough for the tenants that need it.

On the real engine a full batch slows every sequence in it (a CPU step with 16 sequences takes ~1.8x the
solo one, libs/engine/profiles/), and a flood that holds every sequence makes the next tenant wait for
a whole generation before it even starts. So, per request of tenant T:

- T below its share (fewer running than `limit` / tenants with work here) and running no more than any
  other tenant with work starts at once, even past `limit` (up to `most`, the engine's own bound): a
  calm tenant never waits behind a flood;
- otherwise it starts while the batch is below `limit`, or below `protected_limit` while any tenant below
  its share has work here: the batch drains to the size that keeps per-token latency within the bound
  the limit was derived from (EngineProfile.batch_within), and fills up again once it is gone. A heavy
  tenant's share does not lift that bound (its requests wait while a lighter tenant has work), so
  interactive latency wins over the flood's throughput while both have work;
- a freed place goes to the waiting tenant with the fewest running (first come within a tenant).

One tenant alone is always below its share until `limit`: it gets today's behaviour, the whole batch.
Tenants count equally here (the gateway applies tenants' weights before routing). Hand-written: a
small policy over asyncio futures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from libs.engine.profile import load_profile

log = logging.getLogger(__name__)


class HandedBack(Exception):
    """The worker is draining: a request still waiting for a place goes back to JetStream unstarted."""


@dataclass
class ShareStats:
    protected_admissions: int = 0  # started past the limit, below its tenant's share
    held: int = 0  # waited here for a place


class BatchShare:
    def __init__(
        self, limit: int, protected_limit: int, most: int, linger_s: float = 0.0, clock=time.monotonic
    ) -> None:
        self.limit = limit
        self.protected_limit = min(protected_limit, limit)
        self.most = max(most, limit)
        self.linger_s = linger_s
        self._clock = clock
        self._last_done: dict[str, float] = {}  # tenant -> when its last request here ended
        self.stats = ShareStats()
        self.running: Counter[str] = Counter()
        self._waiting: dict[str, deque[asyncio.Future]] = {}

    # --- public --------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def slot(self, tenant: str) -> AsyncIterator[float]:
        """A place in the batch for one request of `tenant`; yields how long it waited for it."""
        waited = 0.0
        if self._may_start(tenant):
            if self.total >= self.limit:
                self.stats.protected_admissions += 1
            self.running[tenant] += 1
        else:
            since = self._clock()
            await self._wait(tenant)  # counted as running when its place was handed over
            waited = self._clock() - since
        try:
            yield waited
        finally:
            self._done(tenant)

    def hand_back_waiting(self) -> int:
        """Draining: every request still waiting here raises HandedBack (its message goes back to the
        queue for the pool's other workers). Returns how many."""
        futures = [f for queue in self._waiting.values() for f in queue if not f.done()]
        self._waiting.clear()
        for future in futures:
            future.set_exception(HandedBack())
        return len(futures)

    @property
    def total(self) -> int:
        return sum(self.running.values())

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    def current_limit(self) -> int:
        """The batch size over-share tenants may fill now."""
        protected = any(self._below_share(t) for t in self._tenants_with_work())
        return self.protected_limit if protected else self.limit

    # --- the policy ----------------------------------------------------------------------------
    def _tenants_with_work(self) -> set[str]:
        """Running or waiting here, or done less than `linger_s` ago: a calm tenant between two requests
        still counts, else the flood refills the batch in the gap and its next request finds it full."""
        now = self._clock()
        recent = {t for t, done in self._last_done.items() if now - done < self.linger_s}
        return set(self.running) | {t for t, q in self._waiting.items() if q} | recent

    def share(self, tenant: str) -> int:
        tenants = self._tenants_with_work() | {tenant}
        return max(1, self.limit // len(tenants))

    def _below_share(self, tenant: str) -> bool:
        return self.running[tenant] < self.share(tenant)

    def _first_in_line(self, tenant: str) -> bool:
        """Below its share and running no more than any other tenant with work: it starts even past the
        limit (a calm tenant beside a flood; a flood alone, up to its share: the whole `limit`)."""
        if not self._below_share(tenant):
            return False
        return all(self.running[tenant] <= self.running[t] for t in self._tenants_with_work())

    def _may_start(self, tenant: str) -> bool:
        if self.total >= self.most:
            return False
        if self._first_in_line(tenant):
            return True
        return self.total < self.current_limit() and not self._waiting.get(tenant)

    async def _wait(self, tenant: str) -> None:
        future = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(tenant, deque()).append(future)
        self.stats.held += 1
        try:
            await future
        except HandedBack:
            raise
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                self._done(tenant)  # granted, then cancelled: pass the place on
            else:
                queue = self._waiting.get(tenant)
                if queue is not None and future in queue:
                    queue.remove(future)
                self._drop_empty(tenant)
            raise

    def _done(self, tenant: str) -> None:
        self.running[tenant] -= 1
        if self.running[tenant] <= 0:
            del self.running[tenant]
        now = self._clock()
        self._last_done[tenant] = now
        if len(self._last_done) > 4 * self.most:  # forget tenants long gone
            self._last_done = {t: d for t, d in self._last_done.items() if now - d < self.linger_s}
        self._release()

    def _release(self) -> None:
        """Hand freed places to waiting tenants, fewest running first."""
        while self._waiting:
            tenant = min(self._waiting, key=lambda t: self.running.get(t, 0))
            if self.total >= self.most or not (self._first_in_line(tenant) or self.total < self.current_limit()):
                return
            future = self._waiting[tenant].popleft()
            self._drop_empty(tenant)
            if not future.done():
                future.set_result(None)
                self.running[tenant] += 1  # counted at once: the next turn of the loop sees it taken

    def _drop_empty(self, tenant: str) -> None:
        if not self._waiting.get(tenant):
            self._waiting.pop(tenant, None)


def batch_share_for(settings, device: str) -> BatchShare | None:
    """The worker's batch share from its settings (None: the guard is off), its drained size derived
    from the profile of the engine on `device`."""
    if not settings.latency_guard:
        return None
    limit, most = settings.capacity, max(settings.max_num_seqs, settings.capacity)
    profile = _profile(settings, device)
    if profile is None:
        return BatchShare(limit, limit, most)
    protected = profile.batch_within(settings.latency_bound, limit)
    if protected == 1 and profile.step_s(1) * settings.latency_bound < profile.step_s(2):
        log.warning(
            "latency bound %.2fx cannot be met beyond one sequence: the batch drains to 1", settings.latency_bound
        )
    log.info(
        "batch share: %d sequences, %d while a tenant below its share has work (%.2fx the solo step, profile %s)",
        limit,
        protected,
        profile.step_s(protected) / profile.solo_step_s,
        profile.commit,
    )
    return BatchShare(limit, protected, most, settings.latency_linger_s)


def _profile(settings, device: str):
    """The engine's cost model: the configured one, else for the simulated engine the one it follows
    (none: a fixed-rate simulation has no batch cost), else the shipped one of the base model."""
    if settings.latency_profile is not None:
        return load_profile(settings.latency_profile, settings.base_model)
    if settings.engine == "sim":
        return load_profile(settings.sim_profile, settings.base_model) if settings.sim_profile else None
    return load_profile(None, settings.base_model, device)
