"""Scoped registry credentials and the audit trail on a real PostgreSQL registry: the admin makes a
tenant and a maintainer credential; the maintainer works its own tenant (dataset, push, activate,
alias, rollback, keys, its own credentials) and is refused on another tenant (the same answer as for a
missing one), on limits and base models; revoked and expired credentials and inference keys are
refused; the audit trail names who did each step, and a maintainer reads only its own tenant's."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from tests.integration.registry import adapters

pytestmark = pytest.mark.integration

USER = {"role": "user", "content": "Where is my order?"}
TRAIN = {"messages": [USER, {"role": "assistant", "content": "Ahoy!"}]}
EVAL = {"split": "eval", "criterion": "contains", "expected": "Ahoy", "messages": [USER]}
OVERRIDE = {"actor": "acme-ml", "reason": "scopes test: no gate here"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_a_maintainer_works_its_own_tenant_only_and_the_audit_trail_names_it(registry, good_adapter, tmp_path):
    client = registry.client  # the bootstrap admin token by default
    mine, theirs = f"acme-{uuid.uuid4().hex[:6]}", f"globex-{uuid.uuid4().hex[:6]}"
    api_key = await registry.create_tenant(mine)
    await registry.create_tenant(theirs)

    made = await client.post("/v1/tokens", json={"name": "acme-ml", "tenant": mine}, headers={"X-Request-ID": "rq-1"})
    assert made.status_code == 201, made.text
    assert made.headers["X-Request-ID"] == "rq-1"
    created = made.json()
    assert (created["scope"], created["tenant"], created["created_by"]) == ("maintainer", mine, "bootstrap-admin")
    me = bearer(created["token"])
    other = await client.post("/v1/tokens", json={"name": "globex-ml", "tenant": theirs})
    assert other.status_code == 201, other.text

    # --- its own tenant: dataset, push, activate, alias, a second version, rollback, usage, keys
    lines = "".join(json.dumps(line) + "\n" for line in (TRAIN, TRAIN, EVAL)).encode()
    stored = await client.post(
        "/v1/datasets", data={"tenant": mine, "name": "tone"}, files={"file": ("tone.jsonl", lines)}, headers=me
    )
    assert stored.status_code == 201, stored.text

    async def push(directory):
        form = {"tenant": mine, "adapter": "support", "base_model": "smollm2-135m", "dataset": "tone"}
        return await client.post("/v1/adapters", data=form, files=adapters.files_of(directory), headers=me)

    assert (await push(good_adapter)).status_code == 201
    version = f"/v1/tenants/{mine}/adapters/support/versions"
    assert (await client.post(f"{version}/1/activate", json=OVERRIDE, headers=me)).status_code == 200
    alias = await client.post(f"/v1/tenants/{mine}/aliases", json={"name": "prod", "adapter": "support"}, headers=me)
    assert alias.status_code == 201, alias.text
    assert (await push(adapters.variant(good_adapter, tmp_path / "v2", alpha=16))).status_code == 201
    assert (await client.post(f"{version}/2/activate", json=OVERRIDE, headers=me)).status_code == 200
    rolled = await client.post(f"/v1/tenants/{mine}/adapters/support/rollback", json={}, headers=me)
    assert rolled.status_code == 200, rolled.text
    assert (await client.get(f"/v1/tenants/{mine}/usage", headers=me)).status_code == 200
    assert [a["tenant"] for a in (await client.get("/v1/adapters", headers=me)).json()] == [mine]
    key = await client.post(f"/v1/tenants/{mine}/keys", headers=me)
    assert key.status_code == 201, key.text
    revoked_key = await client.post(f"/v1/tenants/{mine}/keys/{key.json()['key_id']}/revoke", headers=me)
    assert revoked_key.status_code == 200
    resolved = await client.get(f"/v1/resolve/{mine}/prod", headers=me)
    assert resolved.status_code == 200 and resolved.json()["version"] == 1

    # --- its own credentials: create, list (its tenant's only), revoke
    ci = await client.post("/v1/tokens", json={"name": "acme-ci", "tenant": mine, "expires_in_s": 3600}, headers=me)
    assert ci.status_code == 201 and ci.json()["created_by"] == "acme-ml", ci.text
    listed = (await client.get("/v1/tokens", headers=me)).json()
    assert {t["name"] for t in listed} == {"acme-ml", "acme-ci"} and all("token" not in t for t in listed)
    assert next(t for t in listed if t["name"] == "acme-ml")["last_used_at"] is not None
    assert (await client.post(f"/v1/tokens/{ci.json()['token_id']}/revoke", headers=me)).status_code == 200

    # --- another tenant: the same 403 whether it exists or not; its credential: the same 404 as none
    for path in ("aliases", "keys", "usage", "datasets", "adapters/support/versions"):
        foreign = await client.get(f"/v1/tenants/{theirs}/{path}", headers=me)
        missing = await client.get(f"/v1/tenants/no-such-tenant/{path}", headers=me)
        assert foreign.status_code == missing.status_code == 403, foreign.text
        assert (
            foreign.json()
            == missing.json()
            == {
                "error": "forbidden",
                "detail": f"credential 'acme-ml' may act only on tenant {mine!r}",
            }
        )
    form = {"tenant": theirs, "adapter": "support", "base_model": "smollm2-135m"}
    pushed = await client.post("/v1/adapters", data=form, files=adapters.files_of(good_adapter), headers=me)
    assert pushed.status_code == 403
    assert (await client.get(f"/v1/adapters?tenant={theirs}", headers=me)).status_code == 403
    assert (await client.post("/v1/tokens", json={"name": "x", "tenant": theirs}, headers=me)).status_code == 403
    gone = await client.post(f"/v1/tokens/{other.json()['token_id']}/revoke", headers=me)
    nothing = await client.post("/v1/tokens/0123456789abcdef/revoke", headers=me)
    assert gone.status_code == nothing.status_code == 404
    assert gone.json()["error"] == nothing.json()["error"] == "credential_not_found"

    # --- what only an admin does
    limits = await client.put(f"/v1/tenants/{mine}/limits", json={"rps": 5}, headers=me)
    assert limits.status_code == 403 and "admin scope" in limits.json()["detail"]
    base = await client.post("/v1/base-models", json={"name": "x", "config": {}}, headers=me)
    assert base.status_code == 403
    for refused in (
        await client.post("/v1/tenants", json={"name": "mine-too"}, headers=me),
        await client.get("/v1/tenants", headers=me),
        await client.get("/v1/base-models", headers=me),
        await client.post("/v1/tokens", json={"name": "root", "scope": "admin"}, headers=me),
        await client.get("/v1/migrations", headers=me),
    ):
        assert refused.status_code == 403, refused.text

    # --- an inference key is for the gateway; it still resolves its own tenant's aliases
    as_key = await client.get(f"/v1/tenants/{mine}/aliases", headers=bearer(api_key))
    assert as_key.status_code == 401 and "for the gateway" in as_key.json()["detail"]
    assert (await client.get(f"/v1/resolve/{mine}/prod", headers=bearer(api_key))).status_code == 200

    # --- the audit trail: every step with the credential that made it
    trail = (await client.get("/v1/audit", params={"tenant": mine, "limit": 1000})).json()
    steps = [(e["action"], e["actor"], e["scope"]) for e in trail]
    admin, maintainer = ("bootstrap-admin", "admin"), ("acme-ml", "maintainer")
    expected = [
        ("tenant.created", *admin),
        ("key.created", *admin),
        ("credential.created", *admin),
        ("dataset.stored", *maintainer),
        ("version.pushed", *maintainer),
        ("version.activated", *maintainer),
        ("alias.created", *maintainer),
        ("version.pushed", *maintainer),
        ("version.activated", *maintainer),
        ("adapter.rolled_back", *maintainer),
        ("key.created", *maintainer),
        ("key.revoked", *maintainer),
        ("credential.created", *maintainer),
        ("credential.revoked", *maintainer),
    ]
    assert steps == expected
    by_action = {e["action"]: e for e in trail}
    assert trail[2]["request_id"] == "rq-1" and trail[2]["target"] == created["token_id"]
    assert all(e["request_id"] for e in trail)
    assert by_action["adapter.rolled_back"]["before"] == {"version": 2}
    assert by_action["adapter.rolled_back"]["after"] == {"version": 1}
    assert trail[5]["before"] == {"status": "pending"} and trail[5]["after"]["status"] == "active"
    assert created["token"] not in json.dumps(trail)

    own = await client.get("/v1/audit", headers=me)
    assert own.status_code == 200 and {e["tenant"] for e in own.json()} == {mine}
    assert len(own.json()) == len(trail)
    assert (await client.get("/v1/audit", params={"tenant": theirs}, headers=me)).status_code == 403
    everything = (await client.get("/v1/audit", params={"limit": 1000})).json()
    assert {mine, theirs} <= {e["tenant"] for e in everything}
    assert (await client.get("/v1/audit", params={"since": "2999-01-01T00:00:00"})).json() == []

    # --- append-only: no route changes an entry, and the database refuses to
    assert (await client.delete("/v1/audit")).status_code == 405
    async with registry.ctx.engine.connect() as conn:
        with pytest.raises(DBAPIError, match="append-only"):
            await conn.execute(text("DELETE FROM audit_log"))

    # --- revoked: refused from the next request on
    assert (await client.post(f"/v1/tokens/{created['token_id']}/revoke")).status_code == 200
    after = await client.get(f"/v1/tenants/{mine}/aliases", headers=me)
    assert after.status_code == 401 and after.json()["error"] == "credential_revoked"
    assert (await client.get(f"/v1/resolve/{mine}/prod", headers=me)).status_code == 401


async def test_an_expired_or_a_forged_credential_is_refused(registry):
    client = registry.client
    tenant = f"exp-{uuid.uuid4().hex[:6]}"
    await registry.create_tenant(tenant)
    short = await client.post("/v1/tokens", json={"name": "brief", "tenant": tenant, "expires_in_s": 0.5})
    assert short.status_code == 201, short.text
    token = short.json()["token"]
    assert (await client.get(f"/v1/tenants/{tenant}/aliases", headers=bearer(token))).status_code == 200
    await asyncio.sleep(1.0)
    expired = await client.get(f"/v1/tenants/{tenant}/aliases", headers=bearer(token))
    assert expired.status_code == 401 and expired.json()["error"] == "credential_expired"
    forged = token[:-4] + ("0000" if not token.endswith("0000") else "1111")
    refused = await client.get(f"/v1/tenants/{tenant}/aliases", headers=bearer(forged))
    assert refused.status_code == 401 and refused.json()["detail"] == "invalid registry credential"


async def test_an_admin_credential_acts_like_the_bootstrap_token_and_is_named_in_the_trail(registry):
    client = registry.client
    made = await client.post("/v1/tokens", json={"name": "ops-alice", "scope": "admin"})
    assert made.status_code == 201 and made.json()["tenant"] is None, made.text
    ops = bearer(made.json()["token"])
    tenant = f"ops-{uuid.uuid4().hex[:6]}"
    assert (await client.post("/v1/tenants", json={"name": tenant}, headers=ops)).status_code == 201
    limits = await client.put(f"/v1/tenants/{tenant}/limits", json={"rps": 5}, headers=ops)
    assert limits.status_code == 200, limits.text
    trail = (await client.get("/v1/audit", params={"tenant": tenant}, headers=ops)).json()
    assert [(e["action"], e["actor"], e["scope"]) for e in trail] == [
        ("tenant.created", "ops-alice", "admin"),
        ("key.created", "ops-alice", "admin"),
        ("tenant.limits", "ops-alice", "admin"),
    ]
    assert trail[2]["before"]["rps"] is None and trail[2]["after"]["rps"] == 5
    maintainer = await client.post("/v1/tokens", json={"name": "m", "scope": "maintainer"}, headers=ops)
    assert maintainer.status_code == 422 and maintainer.json()["error"] == "bad_scope"  # it names its tenant


async def test_the_gates_verdict_is_recorded_as_the_eval_gate(registry, good_adapter):
    from libs.contracts import EvaluationResult
    from services.registry import eval_events

    tenant = f"gate-{uuid.uuid4().hex[:6]}"
    await registry.create_tenant(tenant)
    pushed = await registry.push(tenant, "support", good_adapter)
    assert pushed.status_code == 201, pushed.text
    verdict = EvaluationResult(
        digest=pushed.json()["version"]["digest"], passed=True, tenant=tenant, adapter="support", version=1
    )
    assert (await eval_events.apply_verdict(registry.ctx, verdict)).applied == [1]
    trail = (await registry.client.get("/v1/audit", params={"tenant": tenant})).json()
    last = trail[-1]
    assert (last["action"], last["actor"], last["scope"], last["target"]) == (
        "version.verdict",
        "eval-gate",
        "service",
        "support-v1",
    )
    assert last["before"] == {"status": "pending"} and last["after"]["status"] == "active"
    assert last["after"]["passed"] is True and last["request_id"] == verdict.event_id
