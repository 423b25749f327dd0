"""Serving continues from the gateway's cache while the registry's PostgreSQL is down: a resolved
alias keeps serving (past its TTL) with the same checked digest; a never-resolved one is refused with
503, never guessed. PostgreSQL is killed (SIGKILL) and restarted afterwards."""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import pytest

from tests.e2e.gateway.conftest import ServedGateway, _push_and_activate, gateway_settings

pytestmark = pytest.mark.e2e
QUESTION = [{"role": "user", "content": "Where is my order?"}]


async def test_cached_aliases_keep_serving_while_postgres_is_down(
    gateway_postgres, gateway_registry, connections, tones, make_worker
):
    tenant = f"gw-pgdown-{uuid.uuid4().hex[:6]}"
    key = await gateway_registry.create_tenant(tenant)
    digest = await _push_and_activate(gateway_registry, tenant, "support", tones["pirate"].path)
    served = ServedGateway(gateway_settings(connections, resolve_ttl_s=0.5, negative_ttl_s=0.2))
    served.start()
    try:
        await make_worker("gw-pgdown")
        await served.wait_workers(1, including=("gw-pgdown",))
        async with httpx.AsyncClient(
            base_url=served.url, timeout=240, headers={"Authorization": f"Bearer {key}"}
        ) as http:

            async def ask(model: str) -> httpx.Response:
                return await http.post(
                    "/v1/chat/completions", json={"model": model, "messages": QUESTION, "max_tokens": 16}
                )

            before = await ask("support")
            assert before.status_code == 200 and before.json()["system_fingerprint"] == digest
            gateway_postgres.kill()
            try:
                await asyncio.sleep(1.0)  # past the TTL: only the stale fallback can answer now
                during = await ask("support")
                assert during.status_code == 200, during.text
                assert during.json()["system_fingerprint"] == digest  # the same version, checked by the gateway
                assert "Ahoy" in during.json()["choices"][0]["message"]["content"]
                never_seen = await ask("support-v1")
                assert never_seen.status_code == 503, never_seen.text
                assert never_seen.json()["error"]["code"] == "registry_unavailable"
                assert served.gateway.cache.stats.stale_served >= 1
            finally:
                gateway_postgres.start()
            deadline = time.monotonic() + 60
            while (await ask("support-v1")).status_code != 200:  # the registry recovers by itself
                assert time.monotonic() < deadline, "the registry did not recover after PostgreSQL restarted"
                await asyncio.sleep(0.5)
    finally:
        await asyncio.to_thread(served.stop)
