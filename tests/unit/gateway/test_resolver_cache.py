"""Resolver cache: TTLs, negative caching, invalidation by registry events, stale serving while the
registry is unavailable, single-flight lookups, no raw keys in cache keys."""

from __future__ import annotations

import asyncio

from libs.contracts import AdapterEvent, AdapterRef, ResolveReply, ResolveRequest, TenantAuthReply, subjects
from services.gateway.resolver_cache import ResolverCache

KEY = "lpx_acme_0123456789abcdef_" + "cd" * 32
REF = AdapterRef(digest="a" * 64, object_key="adapters/a", base_model="llama", rank=16)


class FakeRegistry:
    def __init__(self) -> None:
        self.replies: dict[str, object] = {}
        self.calls: list[tuple[str, bytes]] = []
        self.down = False
        self.slow = 0.0

    async def __call__(self, subject: str, payload: bytes, timeout: float) -> bytes:
        self.calls.append((subject, payload))
        if self.slow:
            await asyncio.sleep(self.slow)
        if self.down == "timeout":
            raise TimeoutError
        if self.down:
            reply = (
                ResolveReply(found=False, code="unavailable", error="db down")
                if subject == subjects.RESOLVE
                else TenantAuthReply(ok=False, code="unavailable")
            )
            return reply.model_dump_json().encode()
        if subject == subjects.RESOLVE:
            alias = ResolveRequest.model_validate_json(payload).alias
            return self.replies[alias].model_dump_json().encode()
        return self.replies["__auth__"].model_dump_json().encode()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(registry, clock, **kw):
    return ResolverCache(registry, ttl_s=30, negative_ttl_s=2, clock=clock, **kw)


async def test_positive_answers_are_cached_for_their_ttl():
    reg, clock = FakeRegistry(), Clock()
    reg.replies["support"] = ResolveReply(found=True, adapter=REF, version=1)
    cache = make(reg, clock)
    assert (await cache.resolve("acme", "support", KEY)).adapter == REF
    clock.now = 29
    await cache.resolve("acme", "support", KEY)
    assert len(reg.calls) == 1
    clock.now = 31
    await cache.resolve("acme", "support", KEY)
    assert len(reg.calls) == 2


async def test_negative_answers_are_cached_briefly():
    reg, clock = FakeRegistry(), Clock()
    reg.replies["nope"] = ResolveReply(found=False, code="not_found")
    cache = make(reg, clock)
    for _ in range(3):
        assert (await cache.resolve("acme", "nope", KEY)).code == "not_found"
    assert len(reg.calls) == 1
    clock.now = 2.5
    reg.replies["nope"] = ResolveReply(found=True, adapter=REF, version=1)
    assert (await cache.resolve("acme", "nope", KEY)).found
    assert len(reg.calls) == 2


async def test_events_invalidate_the_tenant_only():
    reg, clock = FakeRegistry(), Clock()
    reg.replies["support"] = ResolveReply(found=True, adapter=REF, version=1)
    cache = make(reg, clock)
    await cache.resolve("acme", "support", KEY)
    await cache.resolve("other", "support", KEY)
    registered = AdapterEvent(kind="registered", tenant="acme", adapter="support")
    cache.on_event(registered.model_dump_json().encode())
    assert len(cache) == 2  # a registration changes no resolution
    moved = AdapterEvent(kind="alias_moved", tenant="acme", adapter="support", alias="support")
    cache.on_event(moved.model_dump_json().encode())
    assert len(cache) == 1
    cache.on_event(b"garbage")  # ignored, not raised
    new_ref = REF.model_copy(update={"digest": "b" * 64})
    reg.replies["support"] = ResolveReply(found=True, adapter=new_ref, version=2)
    assert (await cache.resolve("acme", "support", KEY)).adapter.digest == "b" * 64


async def test_an_answer_in_flight_when_the_alias_moved_is_not_cached():
    """The registry answered before the change, the event came first: that answer reaches the lookup
    that waited for it, but the next lookup asks again instead of serving the old version for a TTL."""
    reg, clock = FakeRegistry(), Clock()
    reg.replies["support"] = ResolveReply(found=True, adapter=REF, version=1)
    reg.slow = 0.05
    cache = make(reg, clock)
    lookup = asyncio.create_task(cache.resolve("acme", "support", KEY))
    await asyncio.sleep(0.01)  # asked; the answer (version 1) is on its way
    moved = AdapterEvent(kind="alias_moved", tenant="acme", adapter="support", alias="support")
    cache.on_event(moved.model_dump_json().encode())
    assert (await lookup).version == 1
    reg.slow = 0
    reg.replies["support"] = ResolveReply(found=True, adapter=REF.model_copy(update={"digest": "b" * 64}), version=2)
    assert (await cache.resolve("acme", "support", KEY)).version == 2
    assert len(reg.calls) == 2 and cache.stats.discarded == 1


async def test_stale_entry_served_while_registry_unavailable_but_not_refusals():
    reg, clock = FakeRegistry(), Clock()
    reg.replies["support"] = ResolveReply(found=True, adapter=REF, version=1)
    reg.replies["nope"] = ResolveReply(found=False, code="not_found")
    cache = make(reg, clock)
    await cache.resolve("acme", "support", KEY)
    await cache.resolve("acme", "nope", KEY)
    clock.now = 1000
    for down in (True, "timeout"):
        reg.down = down
        assert (await cache.resolve("acme", "support", KEY)).adapter == REF
        assert (await cache.resolve("acme", "nope", KEY)).code == "unavailable"  # never a stale refusal as success
        assert (await cache.resolve("acme", "never-seen", KEY)).code == "unavailable"
    assert cache.stats.stale_served == 2
    reg.down = False
    clock.now = 1001
    assert (await cache.resolve("acme", "support", KEY)).found


async def test_keys_are_separate_entries_and_never_stored_raw():
    reg, clock = FakeRegistry(), Clock()
    reg.replies["support"] = ResolveReply(found=True, adapter=REF, version=1)
    cache = make(reg, clock)
    other_key = KEY[:-1] + "e"
    await cache.resolve("acme", "support", KEY)
    await cache.resolve("acme", "support", other_key)
    assert len(reg.calls) == 2  # a valid key's answer is never reused for another key
    assert all(KEY not in repr(k) and other_key not in repr(k) for k in cache._entries)


async def test_concurrent_lookups_share_one_request():
    reg, clock = FakeRegistry(), Clock()
    reg.replies["support"] = ResolveReply(found=True, adapter=REF, version=1)
    reg.slow = 0.05
    cache = make(reg, clock)
    replies = await asyncio.gather(*(cache.resolve("acme", "support", KEY) for _ in range(10)))
    assert all(r.found for r in replies) and len(reg.calls) == 1


async def test_authentication_is_cached_like_resolution():
    reg, clock = FakeRegistry(), Clock()
    reg.replies["__auth__"] = TenantAuthReply(ok=True, tenant="acme", aliases=["support"])
    cache = make(reg, clock)
    assert (await cache.authenticate("acme", KEY)).aliases == ["support"]
    await cache.authenticate("acme", KEY)
    assert [s for s, _ in reg.calls] == [subjects.AUTH]


async def test_a_key_in_use_is_refreshed_in_the_background_and_never_waits_at_its_ttl():
    reg, clock = FakeRegistry(), Clock()
    reg.replies["support"] = ResolveReply(found=True, adapter=REF, version=1)
    cache = make(reg, clock, refresh_after_s=20)
    await cache.resolve("acme", "support", KEY)
    clock.now = 19
    await cache.resolve("acme", "support", KEY)
    await asyncio.sleep(0)
    assert len(reg.calls) == 1  # young: served, nothing asked
    reg.slow = 0.05
    clock.now = 21
    moved = REF.model_copy(update={"digest": "b" * 64})
    reg.replies["support"] = ResolveReply(found=True, adapter=moved, version=2)
    assert (await cache.resolve("acme", "support", KEY)).adapter == REF  # served at once, from the cache
    assert (await cache.resolve("acme", "support", KEY)).adapter == REF  # one refresh in flight, not two
    await asyncio.sleep(0.1)
    assert len(reg.calls) == 2 and cache.stats.refreshes == 1
    clock.now = 45  # past the first answer's TTL, not the refreshed one's
    assert (await cache.resolve("acme", "support", KEY)).adapter == moved
    assert len(reg.calls) == 2


async def test_a_refresh_the_registry_cannot_answer_keeps_the_entry_and_is_not_retried_at_once():
    reg, clock = FakeRegistry(), Clock()
    reg.replies["support"] = ResolveReply(found=True, adapter=REF, version=1)
    cache = make(reg, clock, refresh_after_s=20)
    await cache.resolve("acme", "support", KEY)
    reg.down = True
    clock.now = 21
    for _ in range(5):
        assert (await cache.resolve("acme", "support", KEY)).adapter == REF
        await asyncio.sleep(0)
    assert len(reg.calls) == 2  # one refresh tried, not one per request
    clock.now = 31  # past the TTL: asked in the foreground, the stale answer served as before
    assert (await cache.resolve("acme", "support", KEY)).adapter == REF
    assert cache.stats.stale_served >= 1


async def test_refusals_and_invalidated_keys_are_not_refreshed_ahead():
    reg, clock = FakeRegistry(), Clock()
    reg.replies["nope"] = ResolveReply(found=False, code="not_found")
    reg.replies["support"] = ResolveReply(found=True, adapter=REF, version=1)
    cache = make(reg, clock, refresh_after_s=1)
    await cache.resolve("acme", "nope", KEY)
    clock.now = 1.5
    await cache.resolve("acme", "nope", KEY)
    await asyncio.sleep(0)
    assert len(reg.calls) == 1 and cache.stats.refreshes == 0
    await cache.resolve("acme", "support", KEY)
    event = AdapterEvent(kind="alias_moved", tenant="acme", adapter="support", digest="a" * 64)
    cache.on_event(event.model_dump_json().encode())
    clock.now = 3
    await cache.resolve("acme", "support", KEY)  # dropped by the event: asked in the foreground
    assert cache.stats.refreshes == 0 and len(reg.calls) == 3


async def test_an_answer_used_recently_is_kept_warm_while_no_request_comes():
    reg, clock = FakeRegistry(), Clock()
    reg.replies["support"] = ResolveReply(found=True, adapter=REF, version=1)
    cache = make(reg, clock, refresh_after_s=20, keep_warm_s=90)
    await cache.resolve("acme", "support", KEY)
    for now in (10, 21, 25, 42, 55, 63):  # sweeps; no request between t=0 and t=63
        clock.now = now
        cache.refresh_warm_entries()
        await asyncio.sleep(0)
    assert cache.stats.refreshes == 3  # at 21 and 42 (each 20 s after the last), then at 63
    assert len(reg.calls) == 4
    clock.now = 70  # a request after a 70 s pause: answered from the cache, no registry wait
    assert (await cache.resolve("acme", "support", KEY)).found
    assert len(reg.calls) == 4 and cache.stats.misses == 1


async def test_keep_warm_ends_after_keep_warm_s_without_use_and_forgets_the_request():
    reg, clock = FakeRegistry(), Clock()
    reg.replies["support"] = ResolveReply(found=True, adapter=REF, version=1)
    cache = make(reg, clock, refresh_after_s=20, keep_warm_s=30)
    await cache.resolve("acme", "support", KEY)
    for now in (21, 31, 42):  # refreshed at 21; unused since t=0, so not again past t=30
        clock.now = now
        cache.refresh_warm_entries()
        await asyncio.sleep(0)
    assert cache.stats.refreshes == 1
    assert not cache._warm and all(e.ask is None for e in cache._entries.values())  # the key is let go
    clock.now = 60  # past the refreshed answer's TTL: asked in the foreground
    await cache.resolve("acme", "support", KEY)
    assert cache.stats.misses == 2


async def test_a_revoked_key_is_not_kept_warm():
    reg, clock = FakeRegistry(), Clock()
    reg.replies["support"] = ResolveReply(found=True, adapter=REF, version=1)
    cache = make(reg, clock, refresh_after_s=20, keep_warm_s=300)
    await cache.resolve("acme", "support", KEY)
    reg.replies["support"] = ResolveReply(found=False, code="unauthorized")
    clock.now = 21
    cache.refresh_warm_entries()
    await asyncio.sleep(0)
    assert (await cache.resolve("acme", "support", KEY)).code == "unauthorized"  # the refresh's answer
    clock.now = 45
    assert cache.refresh_warm_entries() == 0 and not cache._warm
    event = AdapterEvent(kind="alias_moved", tenant="acme", adapter="support", digest="a" * 64)
    await cache.resolve("acme", "support", KEY)
    cache.on_event(event.model_dump_json().encode())
    assert not cache._warm


async def test_the_sweep_runs_in_the_background_and_stops():
    reg = FakeRegistry()
    reg.replies["support"] = ResolveReply(found=True, adapter=REF, version=1)
    cache = ResolverCache(reg, ttl_s=30, refresh_after_s=0.01, keep_warm_s=60)
    await cache.resolve("acme", "support", KEY)
    cache.start()
    await asyncio.sleep(1.3)  # the sweep runs every refresh_after_s / 4, at least every 1 s
    assert cache.stats.refreshes >= 1
    await cache.stop()
    done = cache.stats.refreshes
    await asyncio.sleep(1.2)
    assert cache.stats.refreshes == done
