"""Heartbeats in a JetStream KV bucket whose TTL makes dead workers disappear by themselves."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, NotFoundError

from libs.contracts import WorkerHeartbeat, subjects

log = logging.getLogger(__name__)


async def heartbeat_bucket(js, ttl_s: float):
    try:
        return await js.key_value(subjects.HEARTBEAT_BUCKET)
    except (BucketNotFoundError, NotFoundError):
        return await js.create_key_value(KeyValueConfig(bucket=subjects.HEARTBEAT_BUCKET, ttl=ttl_s, history=1,
                                                        storage=StorageType.MEMORY))  # fmt: skip


class Heartbeater:
    def __init__(self, kv, worker, interval_s: float) -> None:
        self.kv = kv
        self.worker = worker
        self.interval_s = interval_s
        self._task: asyncio.Task | None = None

    async def beat(self) -> None:
        w = self.worker
        beat = WorkerHeartbeat(worker_id=w.worker_id, pool=w.settings.pool, base_model=w.settings.base_model,
                               max_rank=w.settings.max_lora_rank, capacity=w.settings.capacity,
                               in_flight=w.in_flight, adapters=await w.tiers.resident())  # fmt: skip
        await self.kv.put(w.worker_id, beat.model_dump_json().encode())

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="heartbeat")

    async def _loop(self) -> None:
        while True:
            try:
                await self.beat()
            except Exception:  # noqa: BLE001 - a missed beat must not kill the worker
                log.warning("heartbeat failed", exc_info=True)
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await self.kv.delete(self.worker.worker_id)  # leave the pool at once, not after the TTL
