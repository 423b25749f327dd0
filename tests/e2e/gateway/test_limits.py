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
    await gateway.wait_workers(1)
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
    await gateway.wait_workers(1)
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
    await gateway.wait_workers(1)
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
