"""Migrations in the registry, against real PostgreSQL/NATS: the plan, one TrainJob per adapter on
the work queue through the outbox, one running migration per base pair, adapters without a dataset
listed as failed, pushes linked to their item, and trainer-reported failures."""

from __future__ import annotations

import json

import pytest

from libs.contracts import TrainJob, subjects
from tests.integration.registry.events import stored_messages, wait_until

pytestmark = pytest.mark.integration
USER = {"role": "user", "content": "Where is my order?"}
TRAIN = {"messages": [USER, {"role": "assistant", "content": "Ahoy!"}]}


@pytest.fixture(scope="module")
async def served(registry, adapter_dirs, base_model_path) -> dict:
    """Two tenants serving on SmolLM2 (one with a dataset), and a second base registered."""
    config = json.loads((base_model_path / "config.json").read_text())
    registered = await registry.client.post("/v1/base-models", json={"name": "mig-target", "config": config})
    assert registered.status_code == 201, registered.text
    for tenant, with_data in (("mig-one", True), ("mig-two", False)):
        await registry.create_tenant(tenant)
        if with_data:
            assert (await registry.push_dataset(tenant, "data", [TRAIN, TRAIN])).status_code == 201
        assert (await registry.push(tenant, "support", adapter_dirs["good"])).status_code == 201
        activated = await registry.client.post(
            f"/v1/tenants/{tenant}/adapters/support/versions/1/activate",
            json={"actor": "test", "reason": "migration fixture"},
        )
        assert activated.status_code == 200
    return {"tenants": ["mig-one", "mig-two"]}


async def test_plan_start_and_jobs_exactly_once(registry, connections, served):
    plan = (
        await registry.client.get("/v1/migrations/plan", params={"from_base": "smollm2-135m", "to_base": "mig-target"})
    ).json()
    by_tenant = {i["tenant"]: i for i in plan["items"]}
    assert by_tenant["mig-one"]["dataset"] == "data" and by_tenant["mig-one"]["train_examples"] == 2
    assert by_tenant["mig-two"]["dataset"] is None and "no stored dataset" in by_tenant["mig-two"]["reason"]
    same = await registry.client.get(
        "/v1/migrations/plan", params={"from_base": "smollm2-135m", "to_base": "smollm2-135m"}
    )
    assert same.status_code == 422

    started = await registry.client.post(
        "/v1/migrations", json={"from_base": "smollm2-135m", "to_base": "mig-target", "steps": 5, "seed": 3}
    )
    assert started.status_code == 201, started.text
    status = started.json()
    items = {i["tenant"]: i for i in status["items"] if i["tenant"] in served["tenants"]}
    assert items["mig-one"]["state"] == "training" and items["mig-two"]["state"] == "failed"
    again = await registry.client.post("/v1/migrations", json={"from_base": "smollm2-135m", "to_base": "mig-target"})
    assert again.status_code == 409 and again.json()["error"] == "migration_running"

    async def queued():
        msgs = await stored_messages(connections.nats_url, subjects.TRAIN_STREAM, subjects.TRAIN_JOBS)
        return [m for m in msgs if (m.headers or {}).get("Nats-Msg-Id") == items["mig-one"]["job_id"]]

    jobs = await wait_until(queued)
    assert len(jobs) == 1
    job = TrainJob.model_validate_json(jobs[0].data)
    assert (job.tenant, job.base_model, job.steps, job.seed, job.rank, job.alpha) == (
        "mig-one",
        "mig-target",
        5,
        3,
        16,
        32,
    )
    assert job.migration_id == status["id"] and job.dataset.name == "data" and len(job.target_modules) == 7
    # The trainer reports a failure: the item is failed, the tenant stays on the old base.
    failed = await registry.client.post(
        f"/v1/migrations/{status['id']}/items/{job.migration_item}/failed", json={"reason": "out of memory"}
    )
    assert failed.status_code == 200
    final = (await registry.client.get(f"/v1/migrations/{status['id']}")).json()
    assert final["done"] and {i["tenant"]: i["reason"] for i in final["items"]}["mig-one"] == "out of memory"
    resolved = (await registry.client.get("/v1/resolve/mig-one/support")).json()
    assert resolved["ref"]["base_model"] == "smollm2-135m"
