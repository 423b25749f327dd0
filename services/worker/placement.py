"""Placement: each worker keeps its share of the ring on local disk before requests need it.

The gateways route an adapter to the first worker of its ring order (`libs.routing`, consistent
hashing over the pool's live workers), and while that worker is at the load bound, to the next one in
that order. A worker computes the same ring over the same heartbeats and so knows which adapters are its
own: those whose first `placement_positions` workers include it (2 by default: the owner and the
worker the bound spills to). It fetches those into its disk tier in the background, most
requested first (demand from the gateways: `subjects.ADAPTER_DEMAND_BUCKET`), then the active versions
nobody requested yet (the registry's `subjects.ACTIVE_ADAPTERS_BUCKET`: services/worker/active_set.py), at most
`placement_fetch_per_s`, within `placement_disk_share` of the disk tier; the hottest few also go into
the engine's host-RAM cache. When a version is activated, its owner fetches it at once (the
registry's "activated" event), so a new version's first request does not wait on the object store.

Membership changes are debounced: a new ring is adopted only once it has been seen on two plans in a
row, so a worker flapping in and out does not set off fetch storms; and when the ring moves, only the
adapters that moved to this worker are fetched (the others are on disk already).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from nats.js.errors import BucketNotFoundError, NotFoundError
from pydantic import ValidationError

from libs.contracts import AdapterDemand, AdapterEvent, AdapterRef, subjects
from libs.fleetview.sources import read_heartbeats
from libs.routing import HashRing
from services.worker.active_set import ActiveSet

log = logging.getLogger(__name__)
UNKNOWN_SIZE_BYTES = 1 << 20  # an adapter whose size the registry did not record: counted as 1 MiB


@dataclass(frozen=True)
class Plan:
    owned: tuple[AdapterRef, ...] = ()  # this worker's share, most requested first
    kept: tuple[AdapterRef, ...] = ()  # what fits the disk budget, in that order
    shortfall: int = 0  # owned adapters that do not fit
    requested: frozenset[str] = frozenset()  # digests of `owned` with demand (the others: active, not asked for)


def make_plan(
    me: str,
    members: tuple[str, ...],
    demand: dict[str, tuple[AdapterRef, float]],
    *,
    base_model: str,
    max_rank: int,
    budget_bytes: int,
    positions: int = 1,
) -> Plan:
    """The adapters `me` holds one of the first `positions` places of, on the ring over `members` (pure:
    the gateways' ring, the same answer), in the order to fetch them."""
    if me not in members:
        return Plan()
    ring = HashRing(members)
    mine = []  # (not requested, ring position, -requests, digest): the fetch order
    for digest, (ref, requests) in demand.items():
        if ref.base_model != base_model or ref.rank > max_rank:
            continue
        order = ring.preference_list(digest)[:positions]
        if me in order:
            mine.append(((requests <= 0, order.index(me), -requests, digest), ref))
    # Requested first, and the owner's copies before the spill copies (the owner takes every request
    # while it is under the bound), most requested first; then the active versions nobody asked for.
    owned = tuple(ref for _, ref in sorted(mine, key=lambda entry: entry[0]))
    kept, used = [], 0
    for ref in owned:
        size = ref.size_bytes or UNKNOWN_SIZE_BYTES
        if used + size > budget_bytes:
            break
        kept.append(ref)
        used += size
    requested = frozenset(ref.digest for ref in owned if demand[ref.digest][1] > 0)
    return Plan(owned, tuple(kept), len(owned) - len(kept), requested)


def merge_demand(
    values: list[AdapterDemand], active: dict[str, AdapterRef] | None = None
) -> dict[str, tuple[AdapterRef, float]]:
    """Every gateway's counts for one pool, added up per adapter; the active versions nobody requested
    yet count 0 (placed after every requested one)."""
    merged: dict[str, tuple[AdapterRef, float]] = {}
    for value in values:
        for entry in value.adapters:
            known = merged.get(entry.ref.digest)
            merged[entry.ref.digest] = (entry.ref, entry.requests + (known[1] if known else 0.0))
    for digest, ref in (active or {}).items():
        merged.setdefault(digest, (ref, 0.0))
    return merged


@dataclass
class PlacementStats:
    owned: int = 0
    resident: int = 0  # owned and on this worker's disk
    backlog: int = 0  # kept by the plan, not fetched yet
    shortfall: int = 0  # owned, beyond the disk budget
    fetched: int = 0
    failed: int = 0
    fetched_bytes: int = 0
    members: tuple[str, ...] = field(default_factory=tuple)


class Placement:
    def __init__(self, worker, settings, tiers) -> None:
        self.worker = worker
        self.settings = settings
        self.tiers = tiers
        self.stats = PlacementStats()
        self.plan = Plan()
        self._adopted: tuple[str, ...] = ()
        self._seen: tuple[str, ...] | None = None
        self._queue: list[AdapterRef] = []
        self._wake = asyncio.Event()
        self._retry_at: dict[str, float] = {}  # digest -> when a failed fetch may be tried again
        self._tries: dict[str, int] = {}
        self._tasks: list[asyncio.Task] = []
        self._sub = None
        self.active = ActiveSet(lambda: self.worker.js)

    # --- lifecycle -----------------------------------------------------------------------------
    async def start(self, nc) -> None:
        self._sub = await nc.subscribe(subjects.adapter_event("activated"), cb=self._on_activated)
        self._tasks = [
            asyncio.create_task(self._plan_loop(), name="placement-plan"),
            asyncio.create_task(self._fetch_loop(), name="placement-fetch"),
        ]
        if self.settings.placement_active_set:
            self._tasks.append(asyncio.create_task(self.active.run(), name="placement-active-set"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    def owns(self, digest: str) -> bool:
        """Is this worker one of the first `placement_positions` of the adapter's ring order?"""
        members = self._adopted or (self.worker.worker_id,)
        order = HashRing(members).preference_list(digest)
        return self.worker.worker_id in order[: self.settings.placement_positions]

    # --- planning ------------------------------------------------------------------------------
    async def _plan_loop(self) -> None:
        while True:
            try:
                await self.replan()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the broker is away: plan again at the next tick
                log.warning("placement could not plan: %s", exc)
            await asyncio.sleep(self.settings.placement_interval_s)

    async def replan(self) -> Plan:
        members = await self._members()
        if members != self._adopted:
            if self._adopted and members != self._seen:  # debounced: adopt a change seen twice in a row
                self._seen = members
                return self.plan
            if self._adopted:
                log.info("placement: pool membership changed", extra={"workers": list(members)})
            self._adopted, self._seen = members, None
        s = self.settings
        self.plan = make_plan(
            self.worker.worker_id,
            self._adopted,
            merge_demand(await self._demand(), self.active.refs),
            base_model=s.base_model,
            max_rank=s.max_lora_rank,
            budget_bytes=int(s.disk_cache_bytes * s.placement_disk_share),
            positions=s.placement_positions,
        )
        if self.plan.shortfall:
            log.warning(
                "placement: the disk tier holds %d of the %d adapters this worker owns (LPX_WORKER_DISK_CACHE_BYTES)",
                len(self.plan.kept),
                len(self.plan.owned),
            )
        self._queue = [ref for ref in self.plan.kept if not self.tiers.disk.contains(ref.digest)]
        self._refresh_stats()
        self._wake.set()
        return self.plan

    async def _members(self) -> tuple[str, ...]:
        beats = (await read_heartbeats(self.worker.js)).beats
        now, staleness = time.time(), self.settings.placement_staleness_s
        live = {w for w, b in beats.items() if b.pool == self.settings.pool and now - b.ts <= staleness}
        return tuple(sorted(live | {self.worker.worker_id}))

    async def _demand(self) -> list[AdapterDemand]:
        js = self.worker.js
        try:
            kv = await js.key_value(subjects.ADAPTER_DEMAND_BUCKET)
        except (BucketNotFoundError, NotFoundError):
            return []  # no gateway has counted anything yet
        prefix = f"$KV.{subjects.ADAPTER_DEMAND_BUCKET}."
        info = await js.stream_info(
            f"KV_{subjects.ADAPTER_DEMAND_BUCKET}", subjects_filter=f"{prefix}{subjects.token(self.settings.pool)}.>"
        )
        values = []
        for subject in sorted(info.state.subjects or {}):
            try:
                entry = await kv.get(subject.removeprefix(prefix))
                values.append(AdapterDemand.model_validate_json(entry.value))
            except (NotFoundError, ValidationError, TypeError):
                continue  # expired since the listing, or a newer gateway's format
        return values

    def _refresh_stats(self) -> None:
        kept = self.plan.kept
        resident = sum(1 for ref in kept if self.tiers.disk.contains(ref.digest))
        self.stats.owned, self.stats.resident = len(self.plan.owned), resident
        self.stats.backlog, self.stats.shortfall = len(self._queue), self.plan.shortfall
        self.stats.members = self._adopted

    # --- fetching ------------------------------------------------------------------------------
    async def _on_activated(self, msg) -> None:
        try:
            event = AdapterEvent.model_validate_json(msg.data)
        except ValidationError:
            return
        ref = event.ref
        if ref is None or ref.base_model != self.settings.base_model or ref.rank > self.settings.max_lora_rank:
            return
        if self.owns(ref.digest) and not self.tiers.disk.contains(ref.digest):
            log.info("placement: fetching a newly activated version", extra={"digest": ref.digest[:12]})
            self._queue.insert(0, ref)  # before anything else: its first request may come any moment
            self._refresh_stats()
            self._wake.set()

    async def _fetch_loop(self) -> None:
        gap = 1.0 / max(self.settings.placement_fetch_per_s, 0.01)
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            ref = self._queue.pop(0)
            if self.tiers.disk.contains(ref.digest) or self._retry_at.get(ref.digest, 0) > time.monotonic():
                self._refresh_stats()
                continue
            await self._fetch(ref)
            self._refresh_stats()
            await asyncio.sleep(gap)  # bounded rate: the object store and the link serve requests too

    async def _fetch(self, ref: AdapterRef) -> None:
        try:
            if ref in self.plan.kept[: self.settings.placement_host_ram_top] and ref.digest in self.plan.requested:
                await self.tiers.prewarm(ref)  # also into the engine's host-RAM cache (only what is asked for)
            else:
                await self.tiers.disk.get(ref)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # S3 down, digest mismatch: nothing is cached; tried again later
            self.stats.failed += 1
            tries = self._tries[ref.digest] = self._tries.get(ref.digest, 0) + 1
            self._retry_at[ref.digest] = time.monotonic() + min(300.0, 5.0 * 2**tries)
            log.warning("placement: fetching %s failed: %s", ref.digest[:12], exc)
            return
        self.stats.fetched += 1
        self.stats.fetched_bytes += ref.size_bytes
