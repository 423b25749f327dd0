"""The resolver cache follows the registry's events: when a new version is activated and the alias
moves, the very next requests are served with the new digest, long before the cache TTL (30 s)."""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import pytest

from tests.e2e.gateway.conftest import _push_and_activate

pytestmark = pytest.mark.e2e
QUESTION = [{"role": "user", "content": "Where is my order?"}]


async def test_alias_move_invalidates_the_cache(gateway, gateway_registry, tones, make_worker):
    assert gateway.settings.resolve_ttl_s >= 30
    tenant = f"gw-move-{uuid.uuid4().hex[:6]}"
    key = await gateway_registry.create_tenant(tenant)
    first = await _push_and_activate(gateway_registry, tenant, "support", tones["pirate"].path)
    await make_worker("gw-move")
    await gateway.wait_workers(1, including=("gw-move",))
    async with httpx.AsyncClient(base_url=gateway.url, timeout=240, headers={"Authorization": f"Bearer {key}"}) as http:

        async def served_digest() -> str:
            reply = await http.post(
                "/v1/chat/completions", json={"model": "support", "messages": QUESTION, "max_tokens": 4}
            )
            assert reply.status_code == 200, reply.text
            return reply.json()["system_fingerprint"]

        assert await served_digest() == first  # now cached
        second = await _push_and_activate(gateway_registry, tenant, "support", tones["formal"].path)
        assert second != first
        moved_at = time.monotonic()
        while await served_digest() != second:
            assert time.monotonic() - moved_at < 10, "the cache kept serving the old version"
            await asyncio.sleep(0.2)
