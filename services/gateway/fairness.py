"""Fair share of a saturated pool across tenants, interactive work first.

While a pool has room (its load, in flight + queued on its workers as the routing sees it, is below
`headroom` x the sum of its workers' capacities) a request goes straight on: nothing changes for a pool
that keeps up. Once it is full, requests wait here, one queue per tenant, and each freed place goes to
the next tenant by deficit round robin (each tenant's turn is worth its weight, default 1), so a tenant
sending 10x its share waits behind itself, not in front of everyone else; and it still gets every place
nobody else wants (work-conserving). Interactive requests (HTTP) are served before batch ones (async
submissions), which fill what interactive traffic leaves.

Counted per gateway replica from the pool's load signal (heartbeats + every gateway's recent deltas):
several replicas each grant places from the same view, so the pool can briefly take a few more than
its headroom. Hand-written: deficit round robin over asyncio futures (no library schedules asyncio
waiters across tenants).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from services.gateway import errors

INTERACTIVE, BATCH = "interactive", "batch"


@dataclass
class _Waiter:
    future: asyncio.Future
    since: float


@dataclass(frozen=True)
class TenantWait:
    pool: str
    tenant: str
    waiting: int
    oldest_wait_s: float
    share: float  # its weight over the summed weights of the tenants waiting in the pool


@dataclass
class _Pool:
    # tier -> tenant -> waiters (oldest first); tier -> tenants in round-robin order
    waiting: dict[str, dict[str, deque[_Waiter]]] = field(default_factory=lambda: defaultdict(dict))
    order: dict[str, deque[str]] = field(default_factory=lambda: defaultdict(deque))
    deficit: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    granted: int = 0  # places given and not yet visible in the load signal (dispatch under way)


class FairQueue:
    def __init__(
        self,
        room: Callable[[str], tuple[int, int]],
        *,
        headroom: float = 1.25,
        batch_reserve: float = 0.0,
        weight_of: Callable[[str], float] | None = None,
        on_wait: Callable[[str, str, float], None] | None = None,
        held: Callable[[str], Mapping[str, int]] | None = None,
    ) -> None:
        """`room(pool)` -> (load, capacity) of the pool now. Interactive work may fill a pool up to
        `headroom` x its capacity; batch work only up to its capacity less `batch_reserve` of it, so a
        batch backlog never queues on the workers and interactive requests find a free sequence."""
        self._room = room
        self.headroom = headroom
        self.batch_reserve = batch_reserve
        self.weight_of = weight_of or (lambda tenant: 1.0)
        self.on_wait = on_wait or (lambda tenant, tier, waited: None)
        # pool -> tenant -> requests in flight there (this replica's): an interactive tenant holding
        # less than its weighted share of the pool's capacity goes on even when the pool is full, so a
        # flood that filled the pool first does not make a calm tenant wait for its generations to end.
        # None: no such shortcut (every tenant waits its turn once the pool is full).
        self._held = held
        self._pools: dict[str, _Pool] = defaultdict(_Pool)

    # --- what the dispatcher calls -------------------------------------------------------------------
    async def acquire(self, pool: str, tenant: str, tier: str, deadline: float | None) -> bool:
        """Returns when `tenant` may dispatch into `pool` (true: after a wait); 504 when its deadline
        passes first."""
        state = self._pools[pool]
        # Interactive work queues only behind interactive work; batch work behind anything waiting.
        nobody_ahead = not self._tier_waiting(state, INTERACTIVE) and (tier == INTERACTIVE or not self.waiting(pool))
        if (nobody_ahead and self._has_room(pool, state, tier)) or self._below_share(pool, state, tenant, tier):
            state.granted += 1
            return False
        waiter = _Waiter(asyncio.get_running_loop().create_future(), time.monotonic())
        queue = state.waiting[tier].setdefault(tenant, deque())
        if not queue:
            state.order[tier].append(tenant)
        queue.append(waiter)
        self.kick(pool)
        timeout = None if deadline is None else max(0.0, deadline - time.time())
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), timeout)
        except TimeoutError:
            if waiter.future.done():  # granted in the same instant: take it
                return True
            waiter.future.cancel()
            self._forget(state, tier, tenant, waiter)
            raise errors.deadline(timeout or 0.0) from None
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                self.dispatched(pool)  # granted, then the caller went away: give the place back
            else:
                waiter.future.cancel()
                self._forget(state, tier, tenant, waiter)
            raise
        self.on_wait(tenant, tier, time.monotonic() - waiter.since)
        return True

    def dispatched(self, pool: str) -> None:
        """The granted request is dispatched (now in the load signal) or failed: one place less pending."""
        state = self._pools[pool]
        state.granted = max(0, state.granted - 1)
        self.kick(pool)

    def kick(self, pool: str | None = None) -> int:
        """Grant freed places to the waiting tenants (deficit round robin, interactive first)."""
        granted = 0
        for name in [pool] if pool is not None else list(self._pools):
            state = self._pools[name]
            if not self.waiting(name):
                continue  # nothing to grant: the load is not even looked at
            while (waiter := self._next_with_room(name, state)) is not None:
                waiter.future.set_result(None)
                state.granted += 1
                granted += 1
        return granted

    def _next_with_room(self, pool: str, state: _Pool) -> _Waiter | None:
        for tier in (INTERACTIVE, BATCH):
            if self._tier_waiting(state, tier) and self._has_room(pool, state, tier):
                waiter = self._next(state, tier)
                if waiter is not None:
                    return waiter
        return None

    def batch_limit(self, capacity: int) -> int:
        """How much of a pool's capacity batch work may fill: all but the reserve, at least one."""
        return max(1, capacity - math.ceil(capacity * self.batch_reserve))

    def ahead(self, pool: str, tenant: str) -> int:
        """About how many grants come before a new request of `tenant` (round robin: its own waiting
        requests plus this one, once per tenant waiting)."""
        state = self._pools.get(pool)
        if state is None:
            return 0
        tenants = {t for tier in state.waiting.values() for t, q in tier.items() if q} | {tenant}
        return (self.waiting(pool, tenant) + 1) * len(tenants) - 1 if self.waiting(pool) else 0

    def waiting(self, pool: str, tenant: str | None = None) -> int:
        state = self._pools.get(pool)
        if state is None:
            return 0
        return sum(len(q) for tier in state.waiting.values() for t, q in tier.items() if tenant in (None, t))

    def snapshot(self) -> list[TenantWait]:
        """Per pool and tenant waiting now: how many, the oldest wait, and its share of the pool's
        waiting weight (what deficit round robin gives it) - a starved tenant shows a growing oldest wait."""
        now, rows = time.monotonic(), []
        for pool, state in self._pools.items():
            per_tenant: dict[str, list[_Waiter]] = defaultdict(list)
            for tier in state.waiting.values():
                for tenant, queue in tier.items():
                    per_tenant[tenant].extend(w for w in queue if not w.future.done())
            weights = {t: self.weight_of(t) for t, ws in per_tenant.items() if ws}
            total = sum(weights.values()) or 1.0
            for tenant, waiters in per_tenant.items():
                if waiters:
                    oldest = now - min(w.since for w in waiters)
                    rows.append(TenantWait(pool, tenant, len(waiters), oldest, weights[tenant] / total))
        return rows

    # --- internals -----------------------------------------------------------------------------------
    def _has_room(self, pool: str, state: _Pool, tier: str) -> bool:
        load, capacity = self._room(pool)
        if capacity <= 0:
            return True  # no live worker known: the dispatcher answers 503 at once
        limit = capacity * self.headroom if tier == INTERACTIVE else self.batch_limit(capacity)
        return load + state.granted < limit

    def _below_share(self, pool: str, state: _Pool, tenant: str, tier: str) -> bool:
        """An interactive tenant with nothing waiting that holds less than its weighted share of the
        pool's capacity (among the tenants holding or waiting there); never past twice the headroom."""
        if self._held is None or tier != INTERACTIVE or state.waiting[tier].get(tenant):
            return False
        load, capacity = self._room(pool)
        if capacity <= 0 or load + state.granted >= 2 * capacity * self.headroom:
            return False
        held = self._held(pool)
        waiting = {t for queues in state.waiting.values() for t, q in queues.items() if q}
        tenants = {t for t, n in held.items() if n > 0} | waiting | {tenant}
        share = capacity * self.weight_of(tenant) / sum(self.weight_of(t) for t in tenants)
        return held.get(tenant, 0) < max(1, math.floor(share))

    @staticmethod
    def _tier_waiting(state: _Pool, tier: str) -> bool:
        return any(state.waiting[tier].values())

    def _next(self, state: _Pool, tier: str) -> _Waiter | None:
        order, queues = state.order[tier], state.waiting[tier]
        while order:  # ends: every turn grants or adds a positive weight to a deficit
            tenant = order[0]
            queue = queues.get(tenant)
            while queue and queue[0].future.done():  # timed out or cancelled meanwhile
                queue.popleft()
            if not queue:
                order.popleft()
                queues.pop(tenant, None)
                state.deficit.pop(tenant, None)
                continue
            if state.deficit[tenant] < 1.0:
                state.deficit[tenant] += self.weight_of(tenant)
                order.rotate(-1)
                continue
            state.deficit[tenant] -= 1.0
            waiter = queue.popleft()
            if not queue:
                order.popleft()
                queues.pop(tenant, None)
                state.deficit.pop(tenant, None)
            return waiter
        return None

    @staticmethod
    def _forget(state: _Pool, tier: str, tenant: str, waiter: _Waiter) -> None:
        queue = state.waiting[tier].get(tenant)
        if queue and waiter in queue:
            queue.remove(waiter)
        if queue is not None and not queue:
            state.waiting[tier].pop(tenant, None)
            if tenant in state.order[tier]:
                state.order[tier].remove(tenant)
            state.deficit.pop(tenant, None)
