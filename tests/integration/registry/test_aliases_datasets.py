"""Custom follow-aliases, the gate's explicit "evaluating" step, and training datasets."""

from __future__ import annotations

import json

import pytest

from libs.contracts import AdapterEventKind
from tests.integration.registry.events import adapter_events, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def tenant(registry, adapter_dirs) -> str:
    await registry.create_tenant("alias-co")
    reply = await registry.push("alias-co", "tone", adapter_dirs["good"])
    assert reply.status_code == 201, reply.text
    return "alias-co"


async def test_a_custom_alias_follows_the_active_version(registry, connections, tenant):
    created = await registry.client.post(f"/v1/tenants/{tenant}/aliases", json={"name": "prod", "adapter": "tone"})
    assert created.status_code == 201 and created.json()["version"] is None, created.text
    evaluating = await registry.client.post(f"/v1/tenants/{tenant}/adapters/tone/versions/1/evaluating")
    assert evaluating.status_code == 200 and evaluating.json()["status"] == "evaluating"
    twice = await registry.client.post(f"/v1/tenants/{tenant}/adapters/tone/versions/1/evaluating")
    assert twice.status_code == 409 and twice.json()["error"] == "transition_refused"
    await registry.client.post(
        f"/v1/tenants/{tenant}/adapters/tone/versions/1/activate", json={"actor": "test", "reason": "alias test"}
    )
    resolved = await registry.client.get(f"/v1/resolve/{tenant}/prod")
    assert resolved.status_code == 200 and resolved.json()["version"] == 1
    listed = {a["name"]: a for a in (await registry.client.get(f"/v1/tenants/{tenant}/aliases")).json()}
    assert {n: (a["kind"], a["version"]) for n, a in listed.items()} == {
        "prod": ("follow", 1),
        "tone": ("follow", 1),
        "tone-v1": ("pinned", 1),
    }

    async def moved():
        events = await adapter_events(connections.nats_url, tenant)
        return {e.alias for _, e in events if e.kind == AdapterEventKind.ALIAS_MOVED} >= {"prod", "tone"}

    assert await wait_until(moved)


@pytest.mark.parametrize(("name", "code"), [("tone-v2", "bad_name"), ("tone", "alias_exists"), ("Bad!", "bad_name")])
async def test_bad_custom_aliases_are_refused(registry, tenant, name, code):
    reply = await registry.client.post(f"/v1/tenants/{tenant}/aliases", json={"name": name, "adapter": "tone"})
    assert reply.status_code in (409, 422) and reply.json()["error"] == code, reply.text


async def test_datasets_are_stored_content_addressed(registry, tenant, tmp_path):
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello!"}]}] * 3
    good = tmp_path / "tone.jsonl"
    good.write_text("".join(json.dumps(r) + "\n" for r in rows))
    upload = {"tenant": tenant, "name": "tone-data"}
    reply = await registry.client.post("/v1/datasets", data=upload, files={"file": ("tone.jsonl", good.read_bytes())})
    assert reply.status_code == 201, reply.text
    body = reply.json()
    assert body["examples"] == 3 and body["object_key"] == f"datasets/sha256/{body['digest']}.jsonl"
    assert registry.ctx.store.exists(body["object_key"])
    listed = (await registry.client.get(f"/v1/tenants/{tenant}/datasets")).json()
    assert [d["name"] for d in listed] == ["tone-data"]
    bad = await registry.client.post(
        "/v1/datasets", data={"tenant": tenant, "name": "broken"}, files={"file": ("b.jsonl", b'{"messages": []}\n')}
    )
    assert bad.status_code == 422 and bad.json()["error"] == "bad_dataset"
