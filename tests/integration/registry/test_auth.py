"""The auth-only responder (subjects.AUTH) the gateway uses for base-model requests and /v1/models:
a live key authenticates and lists its tenant's servable aliases; anything else is refused the same way."""

from __future__ import annotations

import uuid

import nats
import pytest

from libs.contracts import TenantAuthReply, TenantAuthRequest, subjects

pytestmark = pytest.mark.integration


async def auth(nats_url: str, payload: bytes) -> TenantAuthReply:
    nc = await nats.connect(nats_url)
    try:
        return TenantAuthReply.model_validate_json((await nc.request(subjects.AUTH, payload, timeout=10)).data)
    finally:
        await nc.drain()


async def test_auth_only_lists_servable_aliases_and_refuses_bad_keys(registry, connections, good_adapter):
    name = f"auth-{uuid.uuid4().hex[:8]}"
    key = await registry.create_tenant(name)
    url = connections.nats_url
    fresh = await auth(url, TenantAuthRequest(api_key=key).model_dump_json().encode())
    assert fresh.ok and fresh.tenant == name and fresh.aliases == []

    reply = await registry.push(name, "support", good_adapter)
    assert reply.status_code == 201, reply.text
    pending = await auth(url, TenantAuthRequest(api_key=key).model_dump_json().encode())
    assert pending.ok and pending.aliases == []  # registered, not active: nothing servable yet
    activated = await registry.client.post(
        f"/v1/tenants/{name}/adapters/support/versions/1/activate", json={"actor": "test", "reason": "auth test"}
    )
    assert activated.status_code == 200, activated.text
    active = await auth(url, TenantAuthRequest(api_key=key).model_dump_json().encode())
    assert active.ok and sorted(active.aliases) == ["support", "support-v1"]

    wrong = key[:-4] + ("0000" if not key.endswith("0000") else "1111")
    for bad in (wrong, "lpx_nobody_0123456789abcdef_" + "ab" * 32, "not-a-key", ""):
        refused = await auth(url, TenantAuthRequest(api_key=bad).model_dump_json().encode())
        assert not refused.ok and refused.code == "unauthorized" and refused.aliases == [] and refused.tenant is None
    malformed = await auth(url, b'{"key": "x"}')
    assert not malformed.ok and malformed.code == "bad_request"
