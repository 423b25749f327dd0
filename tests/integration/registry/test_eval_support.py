"""The registry's side of the eval gate, against real PostgreSQL/S3/NATS: datasets refused line by line
with nothing stored, the eval context the gate asks for (claim, eval set, baseline, threshold),
re-evaluation requests and tenant thresholds."""

from __future__ import annotations

import json

import nats
import pytest

from libs.contracts import AdapterEventKind, EvalContextReply, EvalContextRequest, subjects
from tests.integration.registry.events import adapter_events, wait_until

pytestmark = pytest.mark.integration

USER = {"role": "user", "content": "Where is my order?"}
TRAIN = {"messages": [USER, {"role": "assistant", "content": "Ahoy!"}]}
EVAL = {"split": "eval", "criterion": "contains", "expected": "Ahoy", "messages": [USER]}


async def ask_context(nats_url: str, **request) -> EvalContextReply:
    nc = await nats.connect(nats_url)
    try:
        reply = await nc.request(
            subjects.EVAL_CONTEXT, EvalContextRequest(**request).model_dump_json().encode(), timeout=10
        )
        return EvalContextReply.model_validate_json(reply.data)
    finally:
        await nc.drain()


@pytest.fixture(scope="module")
async def tenant(registry) -> str:
    await registry.create_tenant("evalco")
    return "evalco"


def dataset_objects(registry) -> int:
    store = registry.ctx.store
    return len(list(store.client.list_objects(store.bucket, prefix="datasets/", recursive=True)))


async def test_a_dataset_with_bad_lines_is_refused_with_line_numbers(registry, tenant):
    before = dataset_objects(registry)
    body = "\n".join([json.dumps(TRAIN), "{oops", json.dumps({"messages": [USER]}), json.dumps(EVAL)]).encode()
    reply = await registry.client.post(
        "/v1/datasets", data={"tenant": tenant, "name": "broken"}, files={"file": ("broken.jsonl", body)}
    )
    assert reply.status_code == 422, reply.text
    assert reply.json()["error"] == "bad_dataset" and reply.json()["lines"] == [2, 3]
    assert "line 2: not JSON" in reply.json()["detail"] and "line 3:" in reply.json()["detail"]
    listed = (await registry.client.get(f"/v1/tenants/{tenant}/datasets")).json()
    assert [d["name"] for d in listed if d["name"] == "broken"] == []
    assert dataset_objects(registry) == before


async def test_eval_context_claims_and_names_the_eval_set(registry, connections, tenant, adapter_dirs):
    assert (await registry.push_dataset(tenant, "train-only", [TRAIN])).status_code == 201
    stored = await registry.push_dataset(tenant, "tone", [TRAIN, TRAIN, EVAL])
    assert stored.status_code == 201 and (stored.json()["train_examples"], stored.json()["eval_cases"]) == (2, 1)
    missing = await registry.push(tenant, "support", adapter_dirs["good"], dataset="nope")
    assert missing.status_code == 404 and "no dataset named 'nope'" in missing.json()["detail"]
    pushed = await registry.push(tenant, "support", adapter_dirs["good"], dataset="tone")
    assert pushed.status_code == 201 and pushed.json()["version"]["dataset"] == "tone"

    peek = await ask_context(connections.nats_url, tenant=tenant, adapter="support", version=1)
    assert peek.found and peek.status == "pending" and peek.dataset.name == "tone" and peek.threshold is None
    assert peek.base_spec["name"] == "smollm2-135m" and peek.active_ref is None
    claimed = await ask_context(connections.nats_url, tenant=tenant, adapter="support", version=1, claim=True)
    assert claimed.status == "evaluating" and claimed.ref.digest == pushed.json()["version"]["digest"]

    async def announced():
        kinds = [e.kind for _, e in await adapter_events(connections.nats_url, tenant)]
        return AdapterEventKind.EVALUATING in kinds

    assert await wait_until(announced)
    unknown = await ask_context(connections.nats_url, tenant=tenant, adapter="support", version=9)
    assert not unknown.found and unknown.code and "support-v9" in unknown.error


async def test_the_baseline_is_the_active_version(registry, connections, tenant, adapter_dirs, base_model_path):
    from libs.lora.train import LoraRecipe, random_adapter

    await registry.client.post(
        f"/v1/tenants/{tenant}/adapters/support/versions/1/activate", json={"actor": "test", "reason": "baseline"}
    )
    second = random_adapter(base_model_path, adapter_dirs["root"] / "second", LoraRecipe(seed=77))
    assert (await registry.push(tenant, "support", second)).status_code == 201
    context = await ask_context(connections.nats_url, tenant=tenant, adapter="support", version=2)
    assert context.active_version == 1 and context.active_ref.digest != context.ref.digest
    # A hand-pushed version is evaluated on the tenant's newest dataset that has eval cases.
    assert context.dataset.name == "tone"


async def test_re_evaluation_and_thresholds(registry, connections, tenant):
    rejected = await registry.client.post(
        f"/v1/tenants/{tenant}/adapters/support/versions/2/evaluate", json={"requested_by": "ops"}
    )
    assert rejected.status_code == 200 and rejected.json()["status"] == "pending"

    async def requested():
        events = [e for _, e in await adapter_events(connections.nats_url, tenant)]
        return [e for e in events if e.kind == AdapterEventKind.EVAL_REQUESTED and e.version == 2]

    event = (await wait_until(requested))[0]
    assert event.ref is not None and event.detail == "requested by ops"
    active = await registry.client.post(f"/v1/tenants/{tenant}/adapters/support/versions/1/evaluate", json={})
    assert active.status_code == 409 and active.json()["error"] == "transition_refused"
    bad = await registry.client.patch(f"/v1/tenants/{tenant}", json={"eval_threshold": 1.5})
    assert bad.status_code == 422
    good = await registry.client.patch(f"/v1/tenants/{tenant}", json={"eval_threshold": 0.9})
    assert good.status_code == 200 and good.json()["eval_threshold"] == 0.9
    context = await ask_context(connections.nats_url, tenant=tenant, adapter="support", version=2)
    assert context.threshold == 0.9
