"""Deadlines: a request that cannot finish in time ends with 504 in OpenAI's error shape (streaming
or not), and the late result is dropped, never sent."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.e2e.gateway.conftest import ServedGateway, gateway_settings

pytestmark = pytest.mark.e2e


async def test_deadline_is_504(connections, gateway_registry, tenants, make_worker):
    served = ServedGateway(gateway_settings(connections, request_timeout_s=0.3))
    served.start()
    try:
        await make_worker("gw-slow")
        await served.wait_workers(1, including=("gw-slow",))
        body = {"model": "support", "max_tokens": 64, "messages": [{"role": "user", "content": "Tell me a story."}]}
        async with httpx.AsyncClient(
            base_url=served.url, timeout=60, headers={"Authorization": f"Bearer {tenants.key_a}"}
        ) as http:
            reply = await http.post("/v1/chat/completions", json=body)
            assert reply.status_code == 504, reply.text
            assert reply.json()["error"]["code"] == "deadline_exceeded"
            async with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as streamed:
                text = (await streamed.aread()).decode()
            assert "deadline_exceeded" in text and "[DONE]" not in text
        await asyncio.sleep(0.2)
        assert not served.gateway.dispatcher.jobs  # nothing left waiting for the late results
    finally:
        await asyncio.to_thread(served.stop)
