"""The lifecycle over the real servers: eval verdicts from NATS activate or reject, aliases follow,
rollback, retire, the explicit admin override, and the events every change emits."""

from __future__ import annotations

import uuid

import nats
import pytest

from libs.contracts import AdapterEventKind, EvaluationResult, ResolveReply, ResolveRequest, subjects
from tests.integration.registry import adapters
from tests.integration.registry.events import adapter_events, dead_letters, wait_until

pytestmark = pytest.mark.integration
K = AdapterEventKind


@pytest.fixture(scope="module")
async def tenant(registry) -> dict:
    name = f"life-{uuid.uuid4().hex[:8]}"
    other = f"other-{uuid.uuid4().hex[:8]}"
    return {"name": name, "key": await registry.create_tenant(name), "other_key": await registry.create_tenant(other)}


@pytest.fixture(scope="module")
def contents(adapter_dirs) -> dict[int, object]:
    """Four different valid versions of one adapter."""
    good, root = adapter_dirs["good"], adapter_dirs["root"]
    return {1: good, **{n: adapters.variant(good, root / f"life-v{n}", alpha=32 + n) for n in (2, 3, 4)}}


async def publish_verdict(nats_url: str, result: EvaluationResult) -> None:
    nc = await nats.connect(nats_url)
    try:
        await nc.jetstream().publish(
            subjects.EVALUATED, result.model_dump_json().encode(), stream=subjects.EVENTS_STREAM
        )
    finally:
        await nc.drain()


async def resolve(nats_url: str, **request) -> ResolveReply:
    return await nats_resolve(nats_url, ResolveRequest(**request).model_dump_json().encode())


async def nats_resolve(nats_url: str, payload: bytes) -> ResolveReply:
    nc = await nats.connect(nats_url)
    try:
        reply = await nc.request(subjects.RESOLVE, payload, timeout=10)
        return ResolveReply.model_validate_json(reply.data)
    finally:
        await nc.drain()


async def status_of(registry, tenant: str, number: int) -> str:
    reply = await registry.client.get(f"/v1/tenants/{tenant}/aliases/support-v{number}")
    return reply.json()["status"]


async def wait_status(registry, tenant: str, number: int, wanted: str) -> None:
    async def reached():
        return await status_of(registry, tenant, number) == wanted

    assert await wait_until(reached), f"v{number} never became {wanted}: {await status_of(registry, tenant, number)}"


async def push(registry, tenant: str, directory) -> dict:
    reply = await registry.push(tenant, "support", directory)
    assert reply.status_code == 201, reply.text
    return reply.json()["version"]


async def test_only_a_passing_evaluation_activates(registry, connections, tenant, contents):
    t = tenant["name"]
    v1 = await push(registry, t, contents[1])
    not_yet = await resolve(connections.nats_url, tenant=t, alias="support")
    assert not not_yet.found and not_yet.code == "not_active" and "no active version" in not_yet.error
    await publish_verdict(
        connections.nats_url,
        EvaluationResult(digest=v1["digest"], passed=True, report={"score": 1}, tenant=t, adapter="support", version=1),
    )
    await wait_status(registry, t, 1, "active")
    shown = (await registry.client.get(f"/v1/tenants/{t}/aliases/support")).json()
    assert (shown["number"], shown["current"], shown["eval_report"]) == (1, True, {"score": 1})


async def test_nats_resolution_and_tenant_keys(connections, tenant, contents):
    t = tenant["name"]
    for alias in ("support", "support-v1"):
        reply = await resolve(connections.nats_url, tenant=t, alias=alias, api_key=tenant["key"])
        assert reply.found, reply.error
        assert (reply.version, reply.adapter.rank, reply.adapter.base_model) == (1, 16, "smollm2-135m")
        assert reply.adapter.object_key.endswith(reply.adapter.digest + "/")
    key = tenant["key"]
    tampered = key[:-1] + ("1" if key[-1] == "0" else "0")  # always differs from the real key
    for bad_key in (tenant["other_key"], tampered, "garbage"):
        reply = await resolve(connections.nats_url, tenant=t, alias="support", api_key=bad_key)
        assert not reply.found and reply.code == "unauthorized" and reply.adapter is None
    missing = await resolve(connections.nats_url, tenant=t, alias="nope")
    assert not missing.found and missing.code == "not_found"


async def test_http_resolution_takes_the_tenant_key(registry, tenant):
    t = tenant["name"]
    as_tenant = {"Authorization": f"Bearer {tenant['key']}"}
    with_key = await registry.client.get(f"/v1/resolve/{t}/support", headers=as_tenant)
    assert with_key.status_code == 200 and with_key.json()["version"] == 1
    other = await registry.client.get(
        f"/v1/resolve/{t}/support", headers={"Authorization": f"Bearer {tenant['other_key']}"}
    )
    assert other.status_code == 401
    assert (await registry.client.get(f"/v1/resolve/{t}/support")).json()["ref"]["rank"] == 16  # admin token


async def test_failed_evaluation_rejects_and_the_alias_stays(registry, connections, tenant, contents):
    t = tenant["name"]
    v2 = await push(registry, t, contents[2])
    await publish_verdict(
        connections.nats_url, EvaluationResult(digest=v2["digest"], passed=False, reason="tone score 0.2 < 0.8")
    )
    await wait_status(registry, t, 2, "rejected")
    reply = await resolve(connections.nats_url, tenant=t, alias="support-v2")
    assert not reply.found and reply.code == "not_active" and "tone score 0.2" in reply.error
    current = await resolve(connections.nats_url, tenant=t, alias="support")
    assert current.version == 1


async def test_newer_pass_moves_alias_then_rollback_and_retire(registry, connections, tenant, contents):
    t = tenant["name"]
    v3 = await push(registry, t, contents[3])
    await publish_verdict(connections.nats_url, EvaluationResult(digest=v3["digest"], passed=True))
    await wait_status(registry, t, 3, "active")
    assert (await registry.client.get(f"/v1/tenants/{t}/aliases/support")).json()["number"] == 3
    refused = await registry.client.post(f"/v1/tenants/{t}/adapters/support/versions/3/retire", json={})
    assert refused.status_code == 409 and "roll back" in refused.json()["detail"]
    rolled = await registry.client.post(f"/v1/tenants/{t}/adapters/support/rollback", json={})
    assert rolled.status_code == 200 and rolled.json()["number"] == 1  # v2 was rejected: skipped
    retired = await registry.client.post(
        f"/v1/tenants/{t}/adapters/support/versions/3/retire", json={"reason": "regression"}
    )
    assert retired.status_code == 200 and retired.json()["status"] == "retired"
    again = await registry.client.post(f"/v1/tenants/{t}/adapters/support/rollback", json={})
    assert again.status_code == 409 and again.json()["error"] == "nothing_to_roll_back"


async def test_admin_override_is_explicit_and_recorded(registry, tenant, contents):
    t = tenant["name"]
    await push(registry, t, contents[4])
    url = f"/v1/tenants/{t}/adapters/support/versions/4/activate"
    assert (
        await registry.client.post(url, json={"actor": "ops", "reason": "x"}, headers={"Authorization": "Bearer wrong"})
    ).status_code == 401
    assert (await registry.client.post(url, json={"actor": "ops"})).status_code == 422  # a reason is required
    reply = await registry.client.post(url, json={"actor": "alice", "reason": "gate outage, manual review ok"})
    assert reply.status_code == 200, reply.text
    version = reply.json()
    assert (version["status"], version["override_by"], version["current"]) == ("active", "alice", True)
    assert version["override_reason"] == "gate outage, manual review ok" and version["override_at"]
    retire_rejected = await registry.client.post(f"/v1/tenants/{t}/adapters/support/versions/2/retire", json={})
    assert retire_rejected.status_code == 409 and retire_rejected.json()["error"] == "transition_refused"


async def test_every_change_emitted_its_event(registry, connections, tenant):
    t = tenant["name"]

    async def all_out():
        events = await adapter_events(connections.nats_url, t)
        return events if len(events) >= 16 else None

    events = await wait_until(all_out)
    assert events, "events missing from the stream"
    seen = [(e.kind, e.version, e.alias) for _, e in events]
    assert seen == [
        (K.REGISTERED, 1, "support-v1"),
        (K.EVALUATING, 1, None),
        (K.ACTIVATED, 1, None),
        (K.ALIAS_MOVED, 1, "support"),
        (K.REGISTERED, 2, "support-v2"),
        (K.EVALUATING, 2, None),
        (K.REJECTED, 2, None),
        (K.REGISTERED, 3, "support-v3"),
        (K.EVALUATING, 3, None),
        (K.ACTIVATED, 3, None),
        (K.ALIAS_MOVED, 3, "support"),
        (K.ALIAS_MOVED, 1, "support"),
        (K.RETIRED, 3, None),
        (K.REGISTERED, 4, "support-v4"),
        (K.ACTIVATED, 4, None),
        (K.ALIAS_MOVED, 4, "support"),
    ]
    assert all(msg_id == event.event_id for msg_id, event in events)
    override = next(e for _, e in events if e.kind == K.ACTIVATED and e.version == 4)
    assert "admin override by alice" in override.detail
    assert events[0][1].ref.digest == events[0][1].digest and events[0][1].ref.rank == 16


async def test_late_or_repeated_verdicts_change_nothing(registry, connections, tenant, contents):
    t = tenant["name"]
    v1 = (await registry.client.get(f"/v1/tenants/{t}/aliases/support-v1")).json()
    before = len(await dead_letters(connections.nats_url))
    await publish_verdict(
        connections.nats_url,
        EvaluationResult(digest=v1["digest"], passed=False, reason="late", tenant=t, adapter="support"),
    )

    async def dead_lettered():
        letters = await dead_letters(connections.nats_url)
        return letters[before:] if len(letters) > before else None

    letters = await wait_until(dead_lettered)
    assert letters and "already active" in letters[-1].reason
    assert await status_of(registry, t, 1) == "active"
