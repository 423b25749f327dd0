"""Training requested through the registry's API: a tenant's maintainer queues a TrainJob on its own
dataset (through the outbox, onto the trainers' work queue, exactly once) and the audit trail names
it; another tenant, an unknown dataset or base, and an inference key are refused."""

from __future__ import annotations

import uuid

import pytest

from libs.contracts import TrainJob, subjects
from tests.integration.registry.events import stored_messages, wait_until

pytestmark = pytest.mark.integration

USER = {"role": "user", "content": "Where is my order?"}
TRAIN = {"messages": [USER, {"role": "assistant", "content": "Ahoy!"}]}
EVAL = {"split": "eval", "criterion": "contains", "expected": "Ahoy", "messages": [USER]}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_a_maintainer_trains_on_its_own_dataset_only(registry, connections):
    client = registry.client
    mine, theirs = f"tr-{uuid.uuid4().hex[:6]}", f"tr-{uuid.uuid4().hex[:6]}"
    api_key = await registry.create_tenant(mine)
    await registry.create_tenant(theirs)
    assert (await registry.push_dataset(mine, "tone", [TRAIN, TRAIN, EVAL])).status_code == 201
    assert (await registry.push_dataset(theirs, "tone", [TRAIN, EVAL])).status_code == 201
    made = await client.post("/v1/tokens", json={"name": "tr-ml", "tenant": mine})
    assert made.status_code == 201, made.text
    me = bearer(made.json()["token"])

    body = {"dataset": "tone", "adapter": "support", "steps": 7, "seed": 3, "rank": 8}
    queued = await client.post(f"/v1/tenants/{mine}/train", json=body, headers={**me, "X-Request-ID": "rq-train"})
    assert queued.status_code == 202, queued.text
    reply = queued.json()
    assert reply["progress_subject"] == subjects.train_progress(reply["job_id"])

    async def on_the_queue():
        msgs = await stored_messages(connections.nats_url, subjects.TRAIN_STREAM, subjects.TRAIN_JOBS)
        return [m for m in msgs if (m.headers or {}).get("Nats-Msg-Id") == reply["job_id"]]

    jobs = await wait_until(on_the_queue)
    assert len(jobs) == 1
    job = TrainJob.model_validate_json(jobs[0].data)
    assert (job.tenant, job.adapter, job.base_model, job.steps, job.seed, job.rank, job.alpha) == (
        mine,
        "support",
        "smollm2-135m",
        7,
        3,
        8,
        16,
    )
    assert (job.dataset.name, job.dataset.train_examples, job.dataset.eval_cases) == ("tone", 2, 1)
    assert job.requested_by == "tr-ml (maintainer)"

    # another tenant: refused the same way whether it exists or not; nothing is queued
    for other in (theirs, "no-such-tenant"):
        refused = await client.post(f"/v1/tenants/{other}/train", json=body, headers=me)
        assert refused.status_code == 403, refused.text
        assert refused.json()["detail"] == f"credential 'tr-ml' may act only on tenant {mine!r}"
    missing = await client.post(f"/v1/tenants/{mine}/train", json={**body, "dataset": "nope"}, headers=me)
    assert missing.status_code == 404 and missing.json()["error"] == "dataset_not_found", missing.text
    no_base = await client.post(f"/v1/tenants/{mine}/train", json={**body, "base_model": "nope"}, headers=me)
    assert no_base.status_code == 404 and no_base.json()["error"] == "unknown_base", no_base.text
    assert (await client.post(f"/v1/tenants/{mine}/train", json=body, headers=bearer(api_key))).status_code == 401

    entries = (await client.get("/v1/audit", params={"tenant": mine}, headers=me)).json()
    trained = [e for e in entries if e["action"] == "train.requested"]
    assert len(trained) == 1
    entry = trained[0]
    assert (entry["actor"], entry["scope"], entry["target"], entry["request_id"]) == (
        "tr-ml",
        "maintainer",
        "support",
        "rq-train",
    )
    assert entry["after"]["job_id"] == reply["job_id"] and entry["after"]["dataset"] == "tone"
