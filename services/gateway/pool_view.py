"""Live workers per pool, from the heartbeat KV bucket.

A worker is live while its key exists and its heartbeat is younger than the staleness limit. TTL
expiry in a KV bucket emits no watch event, so the view polls the bucket's keys. Workers that leave
(key deleted by a drain, expired, or stale) are reported to `on_dead`, which re-routes their work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NoKeysError, NotFoundError
from pydantic import ValidationError

from libs.contracts import WorkerHeartbeat, subjects

log = logging.getLogger(__name__)


class NoPoolError(LookupError):
    """No live worker can serve the request (-> 503)."""


@dataclass(frozen=True)
class PoolChoice:
    pool: str
    workers: tuple[str, ...]
    max_rank: int


def live_workers(beats: Iterable[WorkerHeartbeat], now: float, staleness_s: float) -> dict[str, WorkerHeartbeat]:
    return {b.worker_id: b for b in beats if now - b.ts <= staleness_s}


def select_pool(live: Mapping[str, WorkerHeartbeat], base_model: str, rank: int | None) -> PoolChoice:
    """The pool for a request: same base model, and for an adapter of rank r the pool with the smallest
    max_rank >= r that has live workers. Base-model requests (rank None) take the pool with the most live
    workers (ties: smallest max_rank, then name). NoPoolError when none fits."""
    pools: dict[str, list[WorkerHeartbeat]] = {}
    for beat in live.values():
        if beat.base_model == base_model and (rank is None or beat.max_rank >= rank):
            pools.setdefault(beat.pool, []).append(beat)
    if not pools:
        what = f"base model {base_model!r}" + (f" with LoRA rank {rank}" if rank is not None else "")
        raise NoPoolError(f"no live worker serves {what}")

    def pool_rank(name: str) -> int:
        return min(b.max_rank for b in pools[name])

    if rank is None:
        name = min(pools, key=lambda p: (-len(pools[p]), pool_rank(p), p))
    else:
        name = min(pools, key=lambda p: (pool_rank(p), -len(pools[p]), p))
    return PoolChoice(name, tuple(sorted(b.worker_id for b in pools[name])), pool_rank(name))


class PoolView:
    def __init__(self, js, *, staleness_s: float, poll_s: float = 0.5, clock: Callable[[], float] = time.time,
                 on_dead: Callable[[set[str]], None] | None = None) -> None:  # fmt: skip
        self.js = js
        self.staleness_s = staleness_s
        self.poll_s = poll_s
        self._clock = clock
        self.on_dead = on_dead
        self.beats: dict[str, WorkerHeartbeat] = {}
        self._kv = None
        self._task: asyncio.Task | None = None
        self._last_live: set[str] = set()  # live at the previous refresh

    @property
    def live(self) -> dict[str, WorkerHeartbeat]:
        return live_workers(self.beats.values(), self._clock(), self.staleness_s)

    def base_models(self) -> set[str]:
        return {b.base_model for b in self.live.values()}

    def pool_of(self, worker_id: str) -> str | None:
        beat = self.beats.get(worker_id)
        return beat.pool if beat else None

    def select(self, base_model: str, rank: int | None) -> PoolChoice:
        return select_pool(self.live, base_model, rank)

    def pool_workers(self, pool: str) -> tuple[str, ...]:
        return tuple(sorted(w for w, b in self.live.items() if b.pool == pool))

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._loop(), name="pool-view")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - keep the last view; try again next round
                log.warning("heartbeat poll failed", exc_info=True)

    async def refresh(self) -> None:
        self.beats = await self._read()
        now_live = set(self.live)
        # Compared with what was live at the previous refresh (staleness is evaluated on the fly, so the
        # current view already leaves out a worker that went stale in between).
        gone, self._last_live = self._last_live - now_live, now_live
        if gone:
            log.warning("workers left the pool", extra={"workers": sorted(gone)})
            if self.on_dead is not None:
                self.on_dead(gone)

    async def _read(self) -> dict[str, WorkerHeartbeat]:
        if self._kv is None:
            try:
                self._kv = await self.js.key_value(subjects.HEARTBEAT_BUCKET)
            except (BucketNotFoundError, NotFoundError):
                return {}  # no worker has ever started
        try:
            keys = await self._kv.keys()
        except NoKeysError:
            return {}
        beats: dict[str, WorkerHeartbeat] = {}
        entries = await asyncio.gather(*(self._kv.get(k) for k in keys), return_exceptions=True)
        for key, entry in zip(keys, entries, strict=True):
            if isinstance(entry, KeyNotFoundError | NotFoundError):
                continue
            if isinstance(entry, BaseException):
                raise entry
            try:
                beats[key] = WorkerHeartbeat.model_validate_json(entry.value)
            except (ValidationError, TypeError):
                log.warning("ignoring an unreadable heartbeat under %r", key)
        return beats
