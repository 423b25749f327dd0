"""A tenant's value check on a real registry: its maintainer sets the minimum lift and the system
prompt (the admin keeps thresholds and limits), each change is audited, and the eval gate receives
both in its eval-context reply."""

from __future__ import annotations

import uuid

import pytest

from tests.integration.registry.test_eval_support import EVAL, TRAIN, ask_context

pytestmark = pytest.mark.integration
PIRATE = "Always answer like a pirate."


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_a_maintainer_sets_its_value_check_and_the_gate_gets_it(registry, connections, adapter_dirs):
    client = registry.client
    mine, theirs = f"vc-{uuid.uuid4().hex[:6]}", f"vc-{uuid.uuid4().hex[:6]}"
    await registry.create_tenant(mine)
    await registry.create_tenant(theirs)
    made = await client.post("/v1/tokens", json={"name": "vc-ml", "tenant": mine})
    me = bearer(made.json()["token"])
    path = f"/v1/tenants/{mine}/value-check"

    fresh = await client.get(path, headers=me)
    assert fresh.status_code == 200 and fresh.json() == {"tenant": mine, "min_lift": None, "system_prompt": None}
    set_both = await client.patch(path, json={"min_lift": 0.25, "system_prompt": PIRATE}, headers=me)
    assert set_both.status_code == 200, set_both.text
    only_lift = await client.patch(path, json={"min_lift": 0.5}, headers=me)  # the prompt stays
    assert only_lift.json() == {"tenant": mine, "min_lift": 0.5, "system_prompt": PIRATE}
    for bad in ({"min_lift": 1.5}, {"system_prompt": ""}, {"system_prompt": "x" * 8001}):
        assert (await client.patch(path, json=bad, headers=me)).status_code == 422, bad

    # another tenant's, the threshold and the limits: refused to the maintainer
    other = await client.patch(f"/v1/tenants/{theirs}/value-check", json={"min_lift": 0.1}, headers=me)
    assert other.status_code == 403
    assert (await client.patch(f"/v1/tenants/{mine}", json={"eval_threshold": 0.1}, headers=me)).status_code == 403
    assert (await client.put(f"/v1/tenants/{mine}/limits", json={"rps": 1}, headers=me)).status_code == 403
    listed = {t["name"]: t for t in (await client.get("/v1/tenants")).json()}  # the admin sees both fields
    assert (listed[mine]["min_lift"], listed[mine]["system_prompt"]) == (0.5, PIRATE)

    assert (await registry.push_dataset(mine, "tone", [TRAIN, TRAIN, EVAL])).status_code == 201
    assert (await registry.push(mine, "support", adapter_dirs["good"], dataset="tone")).status_code == 201
    context = await ask_context(connections.nats_url, tenant=mine, adapter="support", version=1)
    assert context.found and (context.min_lift, context.system_prompt) == (0.5, PIRATE)
    cleared = await client.patch(path, json={"min_lift": None, "system_prompt": None}, headers=me)
    assert cleared.json()["min_lift"] is None and cleared.json()["system_prompt"] is None
    context = await ask_context(connections.nats_url, tenant=mine, adapter="support", version=1)
    assert (context.min_lift, context.system_prompt) == (None, None)

    entries = [e for e in (await client.get("/v1/audit", params={"tenant": mine})).json()]
    changes = [e for e in entries if e["action"] == "tenant.value_check"]
    assert [(e["actor"], e["scope"]) for e in changes] == [("vc-ml", "maintainer")] * 3
    assert changes[1]["before"] == {"min_lift": 0.25} and changes[1]["after"] == {"min_lift": 0.5}
