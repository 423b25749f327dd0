"""Alias resolution and key authentication through the registry, with a local cache.

* Positive answers are fresh for `ttl_s`. One served after `refresh_after_s` is asked of the registry
  again in the background, so a key in use never waits on the registry when its TTL runs out (every
  `ttl_s` each hot key cost one request its two registry round trips); what is served is never older
  than `ttl_s`, as without it. Refusals (not_found, not_active, unauthorized, bad_request)
  are cached for `negative_ttl_s` only, so a new activation shows up quickly even without its event.
* The registry's lifecycle events (`lpx.events.adapter.>`) drop every entry of the tenant concerned
  (alias moved, version activated, retired or rejected), so a moved alias never serves the old version.
  An answer that was in flight when its tenant was invalidated goes to the lookups that waited for it
  but is not cached: the registry may have answered it before the change.
* When the registry answers `unavailable` (PostgreSQL down) or does not answer in time, the last known
  positive answer is served even past its TTL: serving continues from cache while Postgres is down.
* Keep-warm: an entry used within `keep_warm_s` is refreshed ahead of its TTL by a background sweep
  even when no request comes at the moment it is due, so a tenant that pauses between bursts (a
  minute between batch jobs) does not pay the registry's round trip on its next first request.
  The cost is one registry request per warm entry per `refresh_after_s`.
* Concurrent lookups of one key share one request to the registry.
Cache keys hold a sha256 fingerprint of the API key, never the key itself. To refresh ahead, a warm
entry holds the request it repeats (which carries the key) in memory, the way a request in flight
does; it is dropped when the entry has gone unused for `keep_warm_s` or is invalidated, and never logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pydantic import BaseModel, ValidationError

from libs.contracts import (
    AdapterEvent,
    AdapterEventKind,
    ResolveReply,
    ResolveRequest,
    TenantAuthReply,
    TenantAuthRequest,
    TenantEvent,
    subjects,
)
from services.gateway.auth import fingerprint

log = logging.getLogger(__name__)

# (subject, payload, timeout) -> reply bytes; raises TimeoutError (or anything) when no answer came.
Requester = Callable[[str, bytes, float], Awaitable[bytes]]
INVALIDATING = {
    AdapterEventKind.ACTIVATED,
    AdapterEventKind.RETIRED,
    AdapterEventKind.REJECTED,
    AdapterEventKind.ALIAS_MOVED,
}


@dataclass
class _Entry:
    reply: BaseModel
    positive: bool
    stored_at: float
    asked_at: float = 0.0  # the last background refresh started for it: one per refresh_after_s at most
    used_at: float = 0.0  # the last lookup it answered
    ask: tuple | None = None  # (subject, payload, reply type) to refresh it with while warm


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    stale_served: int = 0
    invalidations: int = 0
    refreshes: int = 0
    discarded: int = 0  # answers asked for before an invalidation of their tenant: not cached


class ResolverCache:
    def __init__(
        self,
        request: Requester,
        *,
        ttl_s: float = 30.0,
        negative_ttl_s: float = 2.0,
        timeout_s: float = 2.0,
        max_entries: int = 100_000,
        refresh_after_s: float | None = None,
        keep_warm_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        on_lookup: Callable[[str], None] | None = None,
    ) -> None:
        self._request = request
        self.ttl_s = ttl_s
        self.negative_ttl_s = negative_ttl_s
        self.timeout_s = timeout_s
        self.max_entries = max_entries
        self.refresh_after_s = refresh_after_s
        self.keep_warm_s = keep_warm_s if refresh_after_s is not None else 0.0
        self._warm: set[tuple] = set()  # keys whose entries hold their `ask`
        self._sweeper: asyncio.Task | None = None
        self._clock = clock
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self._inflight: dict[tuple, asyncio.Future] = {}
        self._refreshing: set[asyncio.Task] = set()  # held: the loop keeps only weak references
        # Bumped per tenant by each invalidation: an answer asked for before it (a lookup or refresh in
        # flight when the alias moved) is still handed to its waiters but not cached.
        self._generation: dict[str, int] = {}
        self._on_lookup = on_lookup or (lambda outcome: None)
        self.stats = CacheStats()

    # --- lookups -------------------------------------------------------------------------------
    async def resolve(self, tenant: str, alias: str, api_key: str) -> ResolveReply:
        key = ("resolve", tenant, alias, fingerprint(api_key))
        payload = ResolveRequest(tenant=tenant, alias=alias, api_key=api_key).model_dump_json().encode()
        return await self._lookup(key, subjects.RESOLVE, payload, ResolveReply)

    async def authenticate(self, tenant: str, api_key: str) -> TenantAuthReply:
        key = ("auth", tenant, "", fingerprint(api_key))
        payload = TenantAuthRequest(api_key=api_key).model_dump_json().encode()
        return await self._lookup(key, subjects.AUTH, payload, TenantAuthReply)

    async def _lookup(self, key: tuple, subject: str, payload: bytes, reply_type):
        entry = self._entries.get(key)
        if entry is not None and self._fresh(entry):
            self._entries.move_to_end(key)
            entry.used_at = self._clock()
            self.stats.hits += 1
            self._on_lookup("hit")
            if self._due_for_refresh(key, entry):
                self._refresh(key, entry, subject, payload, reply_type)
            return entry.reply
        self.stats.misses += 1
        pending = self._inflight.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        return await self._fetch(key, subject, payload, reply_type)

    async def _fetch(self, key: tuple, subject: str, payload: bytes, reply_type, outcome: str = "miss"):
        """Ask the registry once for `key`; lookups of it meanwhile wait on the same answer."""
        future = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        generation = self._generation.get(key[1], 0)
        try:
            reply = await self._ask(subject, payload, reply_type)
            if generation != self._generation.get(key[1], 0):
                return self._answer_from_before_invalidation(future, reply)
            reply = self._settle(key, reply, outcome, (subject, payload, reply_type))
            future.set_result(reply)
            return reply
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody else waits
            raise
        finally:
            self._inflight.pop(key, None)

    def _answer_from_before_invalidation(self, future: asyncio.Future, reply):
        self.stats.discarded += 1
        future.set_result(reply)
        return reply

    def _due_for_refresh(self, key: tuple, entry: _Entry) -> bool:
        return (
            self.refresh_after_s is not None
            and entry.positive
            and self._clock() - max(entry.stored_at, entry.asked_at) >= self.refresh_after_s
            and key not in self._inflight
        )

    def _refresh(self, key: tuple, entry: _Entry, subject: str, payload: bytes, reply_type) -> None:
        """In the background; a refresh the registry cannot answer leaves the entry as it was (served
        until its TTL, then as a stale fallback) and is not tried again before `refresh_after_s`."""
        entry.asked_at = self._clock()
        self.stats.refreshes += 1
        task = asyncio.create_task(self._fetch(key, subject, payload, reply_type, outcome="refresh"))
        self._refreshing.add(task)
        task.add_done_callback(self._refreshing.discard)

    async def _ask(self, subject: str, payload: bytes, reply_type):
        try:
            data = await self._request(subject, payload, self.timeout_s)
            return reply_type.model_validate_json(data)
        except ValidationError as exc:
            log.error("unreadable reply from the registry on %s: %s", subject, exc)
            return _unavailable(reply_type, "unreadable reply from the registry")
        except Exception as exc:
            return _unavailable(reply_type, f"registry did not answer: {type(exc).__name__}")

    def _settle(self, key: tuple, reply, outcome: str, ask: tuple):
        positive = _positive(reply)
        if positive:
            self._store(key, reply, True, ask, used=outcome == "miss")
            self._on_lookup(outcome)
            return reply
        if reply.code == "unavailable":
            entry = self._entries.get(key)
            if entry is not None and entry.positive:
                self.stats.stale_served += 1
                self._on_lookup("stale")
                log.warning("registry unavailable: serving a cached answer", extra={"tenant": key[1]})
                return entry.reply
            self._on_lookup("unavailable")
            return reply
        self._store(key, reply, False)
        self._on_lookup("negative")
        return reply

    def _fresh(self, entry: _Entry) -> bool:
        age = self._clock() - entry.stored_at
        return age < (self.ttl_s if entry.positive else self.negative_ttl_s)

    def _store(self, key: tuple, reply, positive: bool, ask: tuple | None = None, used: bool = True) -> None:
        """`used`: a lookup is waiting on this answer. A refresh's answer keeps the entry's last use,
        so that keep-warm ends `keep_warm_s` after the last request, not after the last refresh."""
        now = self._clock()
        previous = self._entries.get(key)
        used_at = previous.used_at if previous is not None and not used else now
        ask = ask if self.keep_warm_s > 0 and positive else None
        self._entries[key] = _Entry(reply, positive, now, used_at=used_at, ask=ask)
        self._entries.move_to_end(key)
        if ask is None:
            self._warm.discard(key)
        else:
            self._warm.add(key)
        while len(self._entries) > self.max_entries:
            evicted, _ = self._entries.popitem(last=False)
            self._warm.discard(evicted)

    # --- keep-warm -----------------------------------------------------------------------------
    def refresh_warm_entries(self) -> int:
        """Refresh every warm entry that is due; forget the request of those unused for keep_warm_s
        (they expire at their TTL as before). Returns how many refreshes were started."""
        now, started = self._clock(), 0
        for key in list(self._warm):
            entry = self._entries.get(key)
            if entry is None or entry.ask is None or now - entry.used_at > self.keep_warm_s:
                self._warm.discard(key)
                if entry is not None:
                    entry.ask = None
                continue
            if self._due_for_refresh(key, entry):
                self._refresh(key, entry, *entry.ask)
                started += 1
        return started

    def start(self) -> None:
        """The keep-warm sweep, when keep_warm_s > 0: every quarter of refresh_after_s (1-5 s)."""
        if self.keep_warm_s > 0 and self._sweeper is None:
            every_s = min(max(self.refresh_after_s / 4, 1.0), 5.0)
            self._sweeper = asyncio.create_task(self._sweep_every(every_s), name="resolver-keep-warm")

    async def stop(self) -> None:
        tasks = [t for t in (self._sweeper, *self._refreshing) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._sweeper = None

    async def _sweep_every(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                self.refresh_warm_entries()
            except Exception:  # a bug here must not end keep-warm for good
                log.exception("resolver keep-warm sweep failed")

    # --- invalidation --------------------------------------------------------------------------
    def invalidate_tenant(self, tenant: str) -> int:
        self._generation[tenant] = self._generation.get(tenant, 0) + 1
        doomed = [k for k in self._entries if k[1] == tenant]
        for k in doomed:
            del self._entries[k]
            self._warm.discard(k)
        self.stats.invalidations += len(doomed)
        return len(doomed)

    def on_event(self, data: bytes) -> None:
        """A lifecycle event from the registry (`lpx.events.adapter.<kind>`)."""
        try:
            event = AdapterEvent.model_validate_json(data)
        except ValidationError as exc:
            log.warning("ignoring an unreadable adapter event: %s", exc.errors()[0].get("msg"))
            return
        if event.kind in INVALIDATING:
            dropped = self.invalidate_tenant(event.tenant)
            log.debug("cache invalidated", extra={"tenant": event.tenant, "kind": str(event.kind), "dropped": dropped})

    def on_tenant_event(self, data: bytes) -> None:
        """A tenant event from the registry (`lpx.events.tenant.<kind>`): limits changed or a key was
        revoked; either way what is cached for the tenant is dropped."""
        try:
            event = TenantEvent.model_validate_json(data)
        except ValidationError as exc:
            log.warning("ignoring an unreadable tenant event: %s", exc.errors()[0].get("msg"))
            return
        dropped = self.invalidate_tenant(event.tenant)
        log.info("tenant %s: %s; %d cached answers dropped", event.tenant, event.kind, dropped)

    def __len__(self) -> int:
        return len(self._entries)


def _positive(reply) -> bool:
    return bool(reply.found) if isinstance(reply, ResolveReply) else bool(reply.ok)


def _unavailable(reply_type, error: str):
    if reply_type is ResolveReply:
        return ResolveReply(found=False, code="unavailable", error=error)
    return TenantAuthReply(ok=False, code="unavailable", error=error)
