"""What each pool's adapters are asked for, told to the workers so that they pre-load their share.

Every routed request with an adapter counts for its pool. Counts decay with a half-life (yesterday's
favourite fades), and every `publish_every_s` this gateway writes its pool's most requested adapters,
with the refs a worker needs to fetch them, into `subjects.ADAPTER_DEMAND_BUCKET` under
`<pool>.<gateway>`. Each worker adds every gateway's value up and pre-loads the adapters the ring
gives it (services/worker/placement.py). Best effort: a write that fails is tried at the next tick,
and routing never waits on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import defaultdict

from nats.js.api import KeyValueConfig, StorageType

from libs.bus.state import ConnectionState
from libs.contracts import AdapterDemand, AdapterRef, DemandEntry, subjects
from libs.contracts.placement import MAX_DEMAND_ENTRIES

log = logging.getLogger(__name__)


def demand_bucket_config() -> KeyValueConfig:
    # A gateway that is gone stops refreshing its value: the TTL drops its stale counts.
    return KeyValueConfig(
        bucket=subjects.ADAPTER_DEMAND_BUCKET,
        history=1,
        ttl=3600,
        storage=StorageType.FILE,
        description="gateways: recent requests per adapter and pool (what workers pre-load)",
    )


class DemandCounter:
    """Decayed request counts per pool and adapter (pure: no I/O, the clock is passed in)."""

    def __init__(self, half_life_s: float = 1800.0) -> None:
        self.half_life_s = half_life_s
        self._counts: dict[str, dict[str, float]] = defaultdict(dict)
        self._refs: dict[str, AdapterRef] = {}
        self._at: float | None = None

    def seen(self, pool: str, ref: AdapterRef) -> None:
        counts = self._counts[pool]
        counts[ref.digest] = counts.get(ref.digest, 0.0) + 1.0
        self._refs[ref.digest] = ref

    def decay(self, now: float) -> None:
        if self._at is not None and now > self._at:
            factor = math.pow(0.5, (now - self._at) / self.half_life_s)
            for pool, counts in self._counts.items():
                self._counts[pool] = {d: n * factor for d, n in counts.items() if n * factor >= 0.01}
        self._at = now

    def top(self, pool: str, limit: int = MAX_DEMAND_ENTRIES) -> list[DemandEntry]:
        counts = self._counts.get(pool, {})
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:limit]
        return [DemandEntry(ref=self._refs[digest], requests=round(n, 3)) for digest, n in ranked]

    @property
    def pools(self) -> list[str]:
        return sorted(pool for pool, counts in self._counts.items() if counts)


class DemandPublisher:
    def __init__(self, js, gateway_id: str, *, publish_every_s: float = 10.0, half_life_s: float = 1800.0) -> None:
        self.js = js
        self.gateway_id = gateway_id
        self.publish_every_s = publish_every_s
        self.counter = DemandCounter(half_life_s)
        self.state = ConnectionState("adapter demand bucket")
        self._task: asyncio.Task | None = None

    def seen(self, pool: str, ref: AdapterRef) -> None:
        self.counter.seen(pool, ref)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="adapter-demand")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.publish_every_s)
            try:
                await self.publish()
                self.state.ok()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the broker is away: the next tick writes the newer counts
                self.state.failed(exc)

    async def publish(self) -> int:
        """Write this gateway's demand for every pool it has routed to; returns how many values."""
        self.counter.decay(time.time())
        kv = await self.js.key_value(subjects.ADAPTER_DEMAND_BUCKET)
        written = 0
        for pool in self.counter.pools:
            demand = AdapterDemand(
                pool=pool,
                gateway_id=self.gateway_id,
                adapters=self.counter.top(pool),
                half_life_s=self.counter.half_life_s,
            )
            await kv.put(subjects.demand_key(pool, self.gateway_id), demand.model_dump_json().encode())
            written += 1
        return written
