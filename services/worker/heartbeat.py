"""Heartbeats in a JetStream KV bucket whose TTL makes dead workers disappear by themselves.

The bucket is memory-stored (a beat every couple of seconds per worker is not worth a disk write),
so a broker restart loses it: every worker declares it to its BrokerLink, which re-creates it after
a reconnect, and a beat that finds it missing re-creates it at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

from nats.js.api import KeyValueConfig, StorageType

from libs.bus.provision import ensure_buckets
from libs.bus.state import ConnectionState
from libs.contracts import AdapterTier, WorkerHeartbeat, subjects

log = logging.getLogger(__name__)


class WorkerIdInUse(RuntimeError):
    """Another live worker beats under this worker id: starting would take its work subject."""


# The hottest adapters a beat names with their request counts (`lpx top` ranks the fleet's from them).
HOT_ADAPTERS_IN_BEAT = 32
# The most disk-tier digests a beat lists (the most recently used; the count is always whole). With their
# `adapter_since` entries ~160 bytes each: ~80 KB, far under a KV value's 1 MiB, however large the disk
# (GPU and CPU tiers are bounded by the engine's max_loras / max_cpu_loras).
DISK_DIGESTS_IN_BEAT = 512


def bounded(resident: dict[AdapterTier, list[str]]) -> dict[AdapterTier, list[str]]:
    """The tiers as a beat lists them: the disk tier cut to its `DISK_DIGESTS_IN_BEAT` most recent."""
    return {
        tier: digests[:DISK_DIGESTS_IN_BEAT] if tier == AdapterTier.DISK else digests
        for tier, digests in resident.items()
    }


class TierTenure:
    """When each resident adapter entered its current tier (`WorkerHeartbeat.adapter_since`).

    The tiers keep no such history, so it is read off the beats: a change of tier is dated to the first
    beat that shows it (at most one heartbeat interval late), and what is already resident at this
    worker's first beat is dated to that beat. An adapter that leaves every tier is forgotten."""

    def __init__(self) -> None:
        self._entered: dict[str, tuple[AdapterTier, float]] = {}

    def update(self, resident: dict[AdapterTier, list[str]], now: float) -> dict[str, float]:
        entered: dict[str, tuple[AdapterTier, float]] = {}
        for tier, digests in resident.items():
            for digest in digests:
                before = self._entered.get(digest)
                entered[digest] = before if before is not None and before[0] == tier else (tier, now)
        self._entered = entered
        return {digest: since for digest, (_, since) in entered.items()}


def heartbeat_bucket_config(ttl_s: float) -> KeyValueConfig:
    return KeyValueConfig(bucket=subjects.HEARTBEAT_BUCKET, ttl=ttl_s, history=1, storage=StorageType.MEMORY)


class Heartbeater:
    def __init__(self, link, worker, interval_s: float, ttl_s: float) -> None:
        self.link = link
        self.worker = worker
        self.interval_s = interval_s
        self.config = heartbeat_bucket_config(ttl_s)
        self.ttl_s = ttl_s
        self.instance = uuid.uuid4().hex[:12]
        self.tenure = TierTenure()
        self.kv = None
        self.state = ConnectionState("heartbeats")
        self._task: asyncio.Task | None = None
        self._beating = False

    async def claim(self) -> None:
        """Refuse to start under a worker id that another live worker is beating under."""
        w = self.worker
        await ensure_buckets(self.link.js, [self.config], replicas=self.link.connections.nats_replicas)
        kv = await self.link.js.key_value(subjects.HEARTBEAT_BUCKET)
        try:
            other = WorkerHeartbeat.model_validate_json((await kv.get(w.worker_id)).value)
        except Exception:
            return
        age = time.time() - other.ts
        if other.instance != self.instance and age < self.ttl_s:
            raise WorkerIdInUse(
                f"worker id {w.worker_id!r} is in use by another live worker (pool {other.pool}, last heartbeat "
                f"{age:.1f}s ago); give this worker another LPX_WORKER_WORKER_ID, or if that worker is gone, "
                f"start again after {self.ttl_s:.0f}s (its heartbeat expires)"
            )

    async def beat(self) -> None:
        w, s = self.worker, self.worker.settings
        resident = await w.tiers.resident()
        listed = bounded(resident)
        processor = getattr(w, "processor", None)  # None until the worker has started consuming
        beat = WorkerHeartbeat(
            worker_id=w.worker_id,
            pool=s.pool,
            base_model=s.base_model,
            max_rank=s.max_lora_rank,
            capacity=s.capacity,
            in_flight=w.in_flight,
            queued=w.own_pending,
            instance=self.instance,
            adapters=listed,
            adapter_counts={tier: len(digests) for tier, digests in resident.items()},
            max_loras=s.max_loras,
            max_cpu_loras=s.max_cpu_loras,
            generated_tokens=processor.generated_tokens if processor is not None else 0,
            batch_running=w.batch_share.total if w.batch_share is not None else 0,
            batch_limit=w.batch_share.current_limit() if w.batch_share is not None else 0,
            placement_owned=w.placement.stats.owned,
            placement_resident=w.placement.stats.resident,
            placement_backlog=w.placement.stats.backlog,
            bound_passed_on=w.bound.handed_on if getattr(w, "bound", None) is not None else 0,
            bound_kept_over=w.bound.kept_over if getattr(w, "bound", None) is not None else 0,
            tier_hits=dict(w.metrics.found_at),
            adapter_requests=dict(w.tiers.hotness.top(HOT_ADAPTERS_IN_BEAT)),
            adapter_since=self.tenure.update(listed, time.time()),
        )
        if self.kv is None:
            await ensure_buckets(self.link.js, [self.config], replicas=self.link.connections.nats_replicas)
            self.kv = await self.link.js.key_value(subjects.HEARTBEAT_BUCKET)
        try:
            await self.kv.put(w.worker_id, beat.model_dump_json().encode())
        except Exception:
            self.kv = None  # the bucket may be gone with a broker restart: re-created on the next beat
            raise

    def start(self) -> None:
        self._beating = True
        self._task = asyncio.create_task(self._loop(), name="heartbeat")

    def halt(self) -> None:
        """Stop beating at once, without leaving the pool (what a crash looks like to the others).

        A flag as well as the cancel: on Python 3.11 `asyncio.wait_for` (under nats-py's publish) can
        swallow a cancel that lands as its inner future completes, and the loop would beat on for ever."""
        self._beating = False
        if self._task:
            self._task.cancel()

    async def beat_if_beating(self) -> None:
        """A beat now (e.g. when the broker is back), unless the worker has stopped beating."""
        if self._beating:
            await self.beat()

    async def _loop(self) -> None:
        while self._beating:
            try:
                # The pool's workers count who is live by WorkerLoad (load_bound.py). Sent before the beat:
                # the beat (in flight + queued) stays the gateways' fresher view until the next change.
                report_load = getattr(self.worker, "report_load", None)
                if report_load is not None:
                    await report_load()
                await self.beat()
                self.state.ok()
            except Exception as exc:
                self.state.failed(exc)
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        self.halt()
        if self._task:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            if self.kv is not None:
                await self.kv.delete(self.worker.worker_id)  # leave the pool at once, not after the TTL
