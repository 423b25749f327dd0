"""Live workers per pool, from the heartbeat KV bucket.

A worker is live while its key exists and its heartbeat is younger than the staleness limit. TTL
expiry in a KV bucket emits no watch event, so the view polls the bucket's keys. Workers that leave
(key deleted by a drain, expired, or stale) are reported to `on_dead`, which re-routes their work.

Blindness is not death: while the bucket cannot be read (broker restarting, unreachable, or the
bucket lost with a memory-stored broker restart and not yet re-created by the workers), the view
keeps the workers it last saw live, and after it can read again it gives them one staleness window
to beat before any is declared dead. Without that, a broker restart would re-route every request
in flight and answer 503 until the workers' next heartbeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError
from nats.js.kv import KV_DEL, KV_PURGE
from pydantic import ValidationError

from libs.bus.state import ConnectionState
from libs.contracts import WorkerHeartbeat, subjects

log = logging.getLogger(__name__)


class NoPoolError(LookupError):
    """No live worker can serve the request (-> 503)."""


class BucketLost(RuntimeError):
    """The heartbeat bucket existed and is gone (a broker restart lost it): the view is blind."""


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
    def __init__(
        self,
        js,
        *,
        staleness_s: float,
        poll_s: float = 0.5,
        clock: Callable[[], float] = time.time,
        on_dead: Callable[[set[str]], None] | None = None,
    ) -> None:
        self.js = js
        self.staleness_s = staleness_s
        self.poll_s = poll_s
        self._clock = clock
        self.on_dead = on_dead
        self.beats: dict[str, WorkerHeartbeat] = {}
        self.last_pool: dict[str, str] = {}  # worker -> its pool, kept after it left (to retire its consumer)
        self._kv = None
        self._task: asyncio.Task | None = None
        self._last_live: set[str] = set()  # live at the previous refresh
        self._held: dict[str, WorkerHeartbeat] = {}  # live when the view went blind
        self._drained: set[str] = set()  # keys whose last read was a delete marker (a drain)
        self._blind = False
        self._grace_until = 0.0
        self.state = ConnectionState("heartbeat bucket")

    @property
    def live(self) -> dict[str, WorkerHeartbeat]:
        now = self._clock()
        fresh = live_workers(self.beats.values(), now, self.staleness_s)
        if self._held:
            if self._blind or now < self._grace_until:
                for worker, beat in self._held.items():
                    fresh.setdefault(worker, beat)
            else:
                self._held = {}
        return fresh

    def blind(self) -> None:
        """The view cannot see heartbeats (broker lost): hold the workers live until it can again."""
        if not self._blind:
            self._held = {**self._held, **self.live}
            self._blind = True

    def _regained(self) -> None:
        if self._blind:
            self._blind = False
            self._grace_until = self._clock() + self.staleness_s + self.poll_s

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
            except Exception as exc:
                self.blind()
                self.state.failed(exc)

    async def refresh(self) -> None:
        read = await self._read()
        # A worker whose beat is still fresh but whose key is missing and not deleted did not leave: the
        # bucket lost the key (a cluster node that led this memory bucket came back empty, or answered
        # before catching up). Its last beat is kept; staleness drops it if it does not beat again.
        # (Dropping it emptied the pool right after a cluster node rejoined: every request got 503
        # no_worker_available until the workers' next beats.)
        kept = live_workers(self.beats.values(), self._clock(), self.staleness_s)
        self.beats = {**{w: b for w, b in kept.items() if w not in self._drained}, **read}
        self.last_pool.update({worker: beat.pool for worker, beat in self.beats.items()})
        self.state.ok()
        self._regained()
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
        keys = await self._keys()
        beats: dict[str, WorkerHeartbeat] = {}
        drained: set[str] = set()
        self._drained = drained
        entries = await asyncio.gather(*(self._kv.get(k) for k in keys), return_exceptions=True)
        for key, entry in zip(keys, entries, strict=True):
            if isinstance(entry, KeyNotFoundError | NotFoundError):
                if getattr(entry, "op", None) in (KV_DEL, KV_PURGE):
                    drained.add(key)  # deleted by a drain: the worker left
                continue  # expired since the listing, or not found right now: refresh() decides
            if isinstance(entry, BaseException):
                raise entry
            try:
                beats[key] = WorkerHeartbeat.model_validate_json(entry.value)
            except (ValidationError, TypeError):
                log.warning("ignoring an unreadable heartbeat under %r", key)
        return beats

    async def _keys(self) -> list[str]:
        """The bucket's keys from the stream's per-subject counts. Not `KeyValue.keys()`: that creates
        an ordered consumer per call, which the server keeps for 5 minutes after it is used; polled
        twice a second it piles up until the stream refuses more consumers."""
        prefix = f"$KV.{subjects.HEARTBEAT_BUCKET}."
        try:
            info = await self.js.stream_info(f"KV_{subjects.HEARTBEAT_BUCKET}", subjects_filter=f"{prefix}>")
        except (BucketNotFoundError, NotFoundError) as exc:
            raise BucketLost("the heartbeat bucket is gone (re-created by the workers' next beats)") from exc
        return sorted(subject.removeprefix(prefix) for subject in (info.state.subjects or {}))
