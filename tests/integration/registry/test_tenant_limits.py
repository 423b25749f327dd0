"""Tenant limits and key revocation in the registry (real PostgreSQL, NATS): stored, validated,
carried in the auth and resolve replies the gateways cache, and announced by an event (outbox) so
every gateway drops what it cached at once."""

from __future__ import annotations

import asyncio
import uuid

import nats
import pytest

from libs.contracts import TenantAuthReply, TenantAuthRequest, TenantEvent, TenantEventKind, subjects

pytestmark = pytest.mark.integration


async def auth(nats_url: str, key: str) -> TenantAuthReply:
    nc = await nats.connect(nats_url)
    try:
        payload = TenantAuthRequest(api_key=key).model_dump_json().encode()
        return TenantAuthReply.model_validate_json((await nc.request(subjects.AUTH, payload, timeout=10)).data)
    finally:
        await nc.drain()


class Events:
    """Tenant events as a gateway receives them (core NATS subscription)."""

    def __init__(self, url: str) -> None:
        self.url, self.seen = url, []

    async def __aenter__(self):
        self.nc = await nats.connect(self.url)
        await self.nc.subscribe(subjects.TENANT_EVENTS, cb=self._on)
        return self

    async def _on(self, msg) -> None:
        self.seen.append(TenantEvent.model_validate_json(msg.data))

    async def wait_for(self, tenant: str, kind: TenantEventKind, timeout_s: float = 10) -> TenantEvent:
        for _ in range(int(timeout_s / 0.05)):
            found = [e for e in self.seen if e.tenant == tenant and e.kind == kind]
            if found:
                return found[-1]
            await asyncio.sleep(0.05)
        raise AssertionError(f"no {kind} event for {tenant}")

    async def __aexit__(self, *exc) -> None:
        await self.nc.drain()


async def test_limits_are_stored_carried_in_auth_replies_and_announced(registry, connections):
    name = f"lim-{uuid.uuid4().hex[:8]}"
    key = await registry.create_tenant(name)
    assert (await auth(connections.nats_url, key)).limits.model_dump() == {
        "rps": None,
        "tpm": None,
        "concurrency": None,
        "weight": None,
    }
    async with Events(connections.nats_url) as events:
        reply = await registry.client.put(
            f"/v1/tenants/{name}/limits", json={"rps": 2.5, "concurrency": 4, "weight": 3}
        )
        assert reply.status_code == 200, reply.text
        assert (reply.json()["rps_limit"], reply.json()["tpm_limit"], reply.json()["concurrency_limit"]) == (
            2.5,
            None,
            4,
        )
        event = await events.wait_for(name, TenantEventKind.LIMITS_CHANGED)
    assert event.limits.rps == 2.5 and event.limits.concurrency == 4 and event.limits.weight == 3
    assert (await auth(connections.nats_url, key)).limits.rps == 2.5
    assert (await auth(connections.nats_url, key)).limits.weight == 3
    listed = {row["name"]: row for row in (await registry.client.get("/v1/tenants")).json()}
    assert listed[name]["concurrency_limit"] == 4 and listed[name]["fair_weight"] == 3
    cleared = await registry.client.put(f"/v1/tenants/{name}/limits", json={})
    assert cleared.json()["rps_limit"] is None and cleared.json()["concurrency_limit"] is None
    assert cleared.json()["fair_weight"] is None


@pytest.mark.parametrize(
    "body, field",
    [
        ({"rps": 0}, "rps"),
        ({"rps": -1}, "rps"),
        ({"tpm": 0}, "tpm"),
        ({"concurrency": -2}, "concurrency"),
        ({"rps": 1e12}, "rps"),
        ({"tpm": 10**13}, "tpm"),
        ({"burst": 5}, "burst"),
        ({"rps": "fast"}, "rps"),
        ({"weight": 0}, "weight"),
        ({"weight": 5000}, "weight"),
    ],
)
async def test_zero_negative_absurd_or_unknown_limits_are_refused_with_the_field_named(registry, body, field):
    name = f"lim-{uuid.uuid4().hex[:8]}"
    await registry.create_tenant(name)
    reply = await registry.client.put(f"/v1/tenants/{name}/limits", json=body)
    assert reply.status_code == 422, reply.text
    assert field in reply.text
    stored = {row["name"]: row for row in (await registry.client.get("/v1/tenants")).json()}[name]
    assert stored["rps_limit"] is None and stored["tpm_limit"] is None  # nothing half-applied


async def test_limits_of_an_unknown_tenant_are_404(registry):
    assert (await registry.client.put("/v1/tenants/nobody-here/limits", json={"rps": 1})).status_code == 404


async def test_a_revoked_key_stops_authenticating_and_the_revocation_is_announced(registry, connections):
    name = f"rev-{uuid.uuid4().hex[:8]}"
    key = await registry.create_tenant(name)
    second = (await registry.client.post(f"/v1/tenants/{name}/keys")).json()
    keys = (await registry.client.get(f"/v1/tenants/{name}/keys")).json()
    assert len(keys) == 2 and all(k["revoked_at"] is None for k in keys)
    first_id = next(k["key_id"] for k in keys if k["key_id"] != second["key_id"])
    async with Events(connections.nats_url) as events:
        revoked = await registry.client.post(f"/v1/tenants/{name}/keys/{first_id}/revoke")
        assert revoked.status_code == 200 and revoked.json()["revoked_at"]
        event = await events.wait_for(name, TenantEventKind.KEY_REVOKED)
    assert event.key_id == first_id
    assert not (await auth(connections.nats_url, key)).ok
    assert (await auth(connections.nats_url, second["api_key"])).ok  # the other key still works
    again = await registry.client.post(f"/v1/tenants/{name}/keys/{first_id}/revoke")
    assert again.status_code == 200 and again.json()["revoked_at"] == revoked.json()["revoked_at"]  # idempotent
    assert (await registry.client.post(f"/v1/tenants/{name}/keys/{'0' * 16}/revoke")).status_code == 404
    assert (await registry.client.post(f"/v1/tenants/{name}/keys/not-a-key-id/revoke")).status_code == 422
