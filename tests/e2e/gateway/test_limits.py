"""Tenant limits and key revocation through the real gateway (registry, NATS, a worker on vLLM): over a
limit the official openai client gets RateLimitError (429, OpenAI's error shape, Retry-After); a
limit set or cleared in the registry applies at once (the registry's event drops the gateway's cached
auth, no waiting for the cache TTL); so does a revoked key (401 within seconds, the TTL being 30 s)."""

from __future__ import annotations

import asyncio
import time
import uuid

import openai
import pytest

from tests.e2e.gateway.conftest import BASE

pytestmark = pytest.mark.e2e
QUESTION = [{"role": "user", "content": "Where is my order?"}]


def oa(gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, timeout=240)


def ask(client: openai.OpenAI, max_tokens: int = 1):
    return client.chat.completions.create(model=BASE, messages=QUESTION, max_tokens=max_tokens)


async def until(predicate, timeout_s: float = 5.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "not reached in time"
        await asyncio.sleep(0.05)


async def set_limits(gateway, registry, tenant: str, body: dict) -> None:
    """Set limits and wait until this gateway has dropped the tenant's cached auth (the event)."""
    cache = gateway.gateway.cache
    assert any(key[1] == tenant for key in cache._entries), "the test expects a cached auth first"
    reply = await registry.client.put(f"/v1/tenants/{tenant}/limits", json=body)
    assert reply.status_code == 200, reply.text
    await until(lambda: not any(key[1] == tenant for key in cache._entries))


async def test_over_its_rate_a_tenant_gets_rate_limit_error_with_retry_after(gateway, gateway_registry, make_worker):
    await make_worker("gw-limits")
    await gateway.wait_workers(1, including=("gw-limits",))
    tenant = f"lim-{uuid.uuid4().hex[:6]}"
    client = oa(gateway, await gateway_registry.create_tenant(tenant))
    for _ in range(3):
        await asyncio.to_thread(ask, client)  # no limits yet

    await set_limits(gateway, gateway_registry, tenant, {"rps": 0.2})  # one request per 5 s
    await asyncio.to_thread(ask, client)
    with pytest.raises(openai.RateLimitError) as caught:
        await asyncio.to_thread(ask, client)
    assert caught.value.response.headers["retry-after"] == "5"
    assert caught.value.body["code"] == "rate_limit_exceeded" and "0.2 requests per second" in caught.value.message

    await set_limits(gateway, gateway_registry, tenant, {})  # back to the pool default: unlimited
    for _ in range(3):
        await asyncio.to_thread(ask, client)


async def test_requests_in_flight_are_limited_and_counted_until_answered(gateway, gateway_registry, make_worker):
    await make_worker("gw-limits-c")
    await gateway.wait_workers(1, including=("gw-limits-c",))
    tenant = f"conc-{uuid.uuid4().hex[:6]}"
    client = oa(gateway, await gateway_registry.create_tenant(tenant))
    await asyncio.to_thread(ask, client)
    await set_limits(gateway, gateway_registry, tenant, {"concurrency": 1})
    limiter = gateway.gateway.limiter
    long = asyncio.create_task(asyncio.to_thread(ask, client, 48))
    await until(lambda: limiter.in_flight(tenant) == 1)
    with pytest.raises(openai.RateLimitError, match="1 requests in flight"):
        await asyncio.to_thread(ask, client)
    await long
    assert limiter.in_flight(tenant) == 0
    await asyncio.to_thread(ask, client)  # its slot is free again


async def test_a_revoked_key_is_refused_at_once_not_after_the_cache_ttl(gateway, gateway_registry, make_worker):
    await make_worker("gw-revoke")
    await gateway.wait_workers(1, including=("gw-revoke",))
    assert gateway.settings.resolve_ttl_s >= 30
    tenant = f"rev-{uuid.uuid4().hex[:6]}"
    key = await gateway_registry.create_tenant(tenant)
    other = (await gateway_registry.client.post(f"/v1/tenants/{tenant}/keys")).json()
    client = oa(gateway, key)
    await asyncio.to_thread(ask, client)  # cached as valid now
    key_id = key.split("_")[2]
    revoked_at = time.monotonic()
    reply = await gateway_registry.client.post(f"/v1/tenants/{tenant}/keys/{key_id}/revoke")
    assert reply.status_code == 200
    while True:
        try:
            await asyncio.to_thread(ask, client)
        except openai.AuthenticationError:
            break
        assert time.monotonic() - revoked_at < 5, "the revoked key still works after 5 s"
        await asyncio.sleep(0.2)
    await asyncio.to_thread(ask, oa(gateway, other["api_key"]))  # the tenant's other key is unaffected


async def test_submissions_over_the_limit_wait_their_turn_and_a_full_queue_refuses(
    gateway, gateway_registry, make_worker, connections
):
    """Async submissions are not refused at once over a limit: they wait (bounded per tenant) and run
    when the limit allows; once `submit_tenant_queue` wait, the next ones end with rate_limit_exceeded."""
    from libs.client import LoraplexClient

    await make_worker("gw-limits-s")
    await gateway.wait_workers(1, including=("gw-limits-s",))
    tenant = f"subl-{uuid.uuid4().hex[:6]}"
    key = await gateway_registry.create_tenant(tenant)
    await asyncio.to_thread(ask, oa(gateway, key))
    await set_limits(gateway, gateway_registry, tenant, {"rps": 0.5})  # one every 2 s
    settings = gateway.gateway.settings
    queue, settings.submit_tenant_queue = settings.submit_tenant_queue, 2
    try:
        async with LoraplexClient(connections.nats_url, api_key=key) as lpx:
            started = time.monotonic()
            ids = [await lpx.submit(BASE, messages=QUESTION, max_tokens=1) for _ in range(6)]
            results = await asyncio.gather(*(lpx.result(rid, timeout=120) for rid in ids))
            took = time.monotonic() - started
    finally:
        settings.submit_tenant_queue = queue
    ok = [r for r in results if r.ok]
    refused_ = [r for r in results if not r.ok]
    assert len(ok) == 3, [r.error for r in refused_]  # one at once, two after waiting 2 s and 4 s
    assert took >= 3.5, took
    assert all(r.error.code == "rate_limit_exceeded" and "already wait" in r.error.message for r in refused_)
    assert gateway.gateway.submissions.waiting_for_limits.get(tenant, 0) == 0


async def test_a_submission_waiting_for_its_limit_ends_401_when_its_key_is_revoked(
    gateway, gateway_registry, make_worker, connections
):
    from libs.client import LoraplexClient

    await make_worker("gw-limits-r")
    await gateway.wait_workers(1, including=("gw-limits-r",))
    tenant = f"subr-{uuid.uuid4().hex[:6]}"
    key = await gateway_registry.create_tenant(tenant)
    other = await gateway_registry.create_tenant(f"subo-{uuid.uuid4().hex[:6]}")
    await asyncio.to_thread(ask, oa(gateway, key))
    await set_limits(gateway, gateway_registry, tenant, {"rps": 0.125})  # one every 8 s
    async with LoraplexClient(connections.nats_url, api_key=key) as lpx:
        first = await lpx.submit(BASE, messages=QUESTION, max_tokens=1)
        assert (await lpx.result(first, timeout=120)).ok
        waiting = await lpx.submit(BASE, messages=QUESTION, max_tokens=1)
        await until(lambda: gateway.gateway.submissions.waiting_for_limits.get(tenant, 0) == 1, 10)
        key_id = key.split("_")[2]
        assert (await gateway_registry.client.post(f"/v1/tenants/{tenant}/keys/{key_id}/revoke")).status_code == 200
        result = await lpx.result(waiting, timeout=60)
        assert not result.ok and result.error.code == "invalid_api_key"
        # another tenant's submission is unaffected (and may name its tier)
        rid = await lpx.submit(BASE, messages=QUESTION, max_tokens=1, api_key=other, tier="interactive")
        assert (await lpx.result(rid, 120)).ok


async def test_two_gateway_replicas_count_a_tenant_against_the_same_limits(
    gateway, gateway_registry, make_worker, connections
):
    from tests.e2e.gateway.conftest import ServedGateway, gateway_settings

    await make_worker("gw-limits-2")
    await gateway.wait_workers(1, including=("gw-limits-2",))
    second = ServedGateway(gateway_settings(connections, gateway_id="gw-second"))
    second.start()
    try:
        await second.wait_workers(1, including=("gw-limits-2",))
        tenant = f"two-{uuid.uuid4().hex[:6]}"
        key = await gateway_registry.create_tenant(tenant)
        one, two = oa(gateway, key), oa(second, key)
        await asyncio.to_thread(ask, one)
        await asyncio.to_thread(ask, two)
        reply = await gateway_registry.client.put(f"/v1/tenants/{tenant}/limits", json={"concurrency": 1, "weight": 3})
        assert reply.status_code == 200
        for served in (gateway, second):
            await until(lambda s=served: not any(k[1] == tenant for k in s.gateway.cache._entries))
        # Each replica sees the other's requests one report late: wait until both know the earlier ones ended.
        await until(lambda: gateway.gateway.limiter.others_in_flight(tenant) == 0)
        await until(lambda: second.gateway.limiter.others_in_flight(tenant) == 0)
        long = asyncio.create_task(asyncio.to_thread(ask, one, 48))  # holds the tenant's one place on gateway 1
        await until(lambda: gateway.gateway.limiter.in_flight(tenant) == 1)
        await until(lambda: second.gateway.limiter.others_in_flight(tenant) == 1)  # gateway 1's report came
        with pytest.raises(openai.RateLimitError, match="1 requests in flight"):
            await asyncio.to_thread(ask, two)
        await long
        await until(lambda: second.gateway.limiter.others_in_flight(tenant) == 0)  # gateway 1 reported it idle
        await asyncio.to_thread(ask, two)
        assert second.gateway.weights.get(tenant) == 3  # its fair-share weight came with its auth
        assert second.gateway.limit_sync.reports_received > 0
    finally:
        second.stop()
