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

from libs.broker import ConnectionState
from libs.contracts import WorkerHeartbeat, subjects
from libs.messaging import ensure_buckets

log = logging.getLogger(__name__)


class WorkerIdInUse(RuntimeError):
    """Another live worker beats under this worker id: starting would take its work subject."""


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
        self.kv = None
        self.state = ConnectionState("heartbeats")
        self._task: asyncio.Task | None = None

    async def claim(self) -> None:
        """Refuse to start under a worker id that another live worker is beating under."""
        w = self.worker
        await ensure_buckets(self.link.js, [self.config], replicas=self.link.connections.nats_replicas)
        kv = await self.link.js.key_value(subjects.HEARTBEAT_BUCKET)
        try:
            other = WorkerHeartbeat.model_validate_json((await kv.get(w.worker_id)).value)
        except Exception:  # noqa: BLE001 - no key (or a deleted / unreadable one): the id is free
            return
        age = time.time() - other.ts
        if other.instance != self.instance and age < self.ttl_s:
            raise WorkerIdInUse(
                f"worker id {w.worker_id!r} is in use by another live worker (pool {other.pool}, last heartbeat "
                f"{age:.1f}s ago); give this worker another LPX_WORKER_WORKER_ID, or if that worker is gone, "
                f"start again after {self.ttl_s:.0f}s (its heartbeat expires)"
            )

    async def beat(self) -> None:
        w = self.worker
        beat = WorkerHeartbeat(worker_id=w.worker_id, pool=w.settings.pool, base_model=w.settings.base_model,
                               max_rank=w.settings.max_lora_rank, capacity=w.settings.capacity,
                               in_flight=w.in_flight, queued=w.own_pending, instance=self.instance,
                               adapters=await w.tiers.resident())  # fmt: skip
        if self.kv is None:
            await ensure_buckets(self.link.js, [self.config], replicas=self.link.connections.nats_replicas)
            self.kv = await self.link.js.key_value(subjects.HEARTBEAT_BUCKET)
        try:
            await self.kv.put(w.worker_id, beat.model_dump_json().encode())
        except Exception:
            self.kv = None  # the bucket may be gone with a broker restart: re-created on the next beat
            raise

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="heartbeat")

    async def _loop(self) -> None:
        while True:
            try:
                await self.beat()
                self.state.ok()
            except Exception as exc:  # noqa: BLE001 - a missed beat must not kill the worker
                self.state.failed(exc)
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            if self.kv is not None:
                await self.kv.delete(self.worker.worker_id)  # leave the pool at once, not after the TTL
