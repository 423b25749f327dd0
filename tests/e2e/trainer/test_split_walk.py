"""The seed design's split of who does what (issue 30), walked end to end and all real: the registry as
its own process, a trainer process, the eval gate and a worker on the session's vLLM engine, the
gateway under uvicorn, and `lpx` as a subprocess with the credential of each role.

* the admin creates a tenant (its inference key) and a maintainer credential;
* the maintainer pushes a dataset, sets its tenant's system prompt for the value check, trains
  (`lpx train`, through the registry's train route), and the gate passes the version (which
  activates it) with both lifts reported by `lpx adapter report`; it points an alias at it;
* the maintainer is refused on another tenant and on limits;
* the inference key is answered by the gateway and refused by the registry (and the maintainer
  credential refused by the gateway);
* `lpx audit` lists every step with the credential that made it."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import openai
import pytest

from tests.e2e.gateway.conftest import ServedGateway, gateway_settings
from tests.e2e.trainer.conftest import TrainerProcess, tone_dataset
from tests.e2e.worker.conftest import make_worker  # noqa: F401

pytestmark = pytest.mark.e2e
SYSTEM_PROMPT = "You are a friendly customer support agent."
QUESTION = [{"role": "user", "content": "Do you sell gift cards?"}]


def write_jsonl(path, lines) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


async def lpx_as(registry_proc, token: str | None, *args: str) -> tuple[int, str]:
    """`lpx` with a registry credential (None: the bootstrap admin token of the registry's env)."""
    env = dict(registry_proc.env)
    if token is not None:
        env["LPX_REGISTRY_TOKEN"] = token
    saved, registry_proc.env = registry_proc.env, env
    try:
        return await registry_proc.lpx(*args)
    finally:
        registry_proc.env = saved


async def test_admin_maintainer_and_inference_key_each_do_their_part(
    registry_proc,
    gate_a,
    make_worker,  # noqa: F811
    connections,
    tmp_path,
):
    suffix = tmp_path.name[-6:].lower().replace("_", "-").strip("-") or "x"
    tenant, other = f"walk-{suffix}", f"walk-other-{suffix}"

    # --- the admin: two tenants, a maintainer credential for one
    status, output = await lpx_as(registry_proc, None, "tenant", "create", tenant)
    assert status == 0, output
    api_key = re.search(r"lpx_[A-Za-z0-9_-]+", output)[0]
    assert (await lpx_as(registry_proc, None, "tenant", "create", other))[0] == 0
    status, output = await lpx_as(registry_proc, None, "tenant", "token", "create", tenant, "--name", "walk-ml")
    assert status == 0, output
    token = re.search(r"lpxr_[0-9a-f]+_[0-9a-f]+", output)[0]

    # --- the maintainer: dataset, system prompt, training, the gate, activation
    data = tmp_path / "support-data.jsonl"
    write_jsonl(data, tone_dataset("pirate"))
    status, output = await lpx_as(registry_proc, token, "dataset", "push", tenant, str(data))
    assert status == 0, output
    status, output = await lpx_as(
        registry_proc, token, "tenant", "value-check", tenant, "--system-prompt", SYSTEM_PROMPT
    )
    assert status == 0 and "friendly customer support agent" in output, output
    trainer = TrainerProcess(
        registry_proc, "trainer-walk", tmp_path / "trainer.log", LPX_TRAINER_WORK_DIR=str(tmp_path / "work")
    )
    try:
        await trainer.wait_ready()
        status, output = await lpx_as(
            registry_proc, token, "train", tenant, "--dataset", "support-data", "--steps", "12", "--batch-size", "2",
            "--seed", "3",
        )  # fmt: skip
    finally:
        trainer.stop()
    assert status == 0 and f"trained and pushed {tenant}/support-v1" in output, output
    row = (await registry_proc.client.get(f"/v1/tenants/{tenant}/adapters/support/versions")).json()[-1]
    assert row["status"] == "active" and row["number"] == 1, row
    report = row["eval_report"]
    assert report["passed"] and report["lift"] is not None and report["lift_prompted"] is not None, report
    assert report["system_prompt"] == SYSTEM_PROMPT
    status, shown = await lpx_as(registry_proc, token, "adapter", "report", f"{tenant}/support")
    assert status == 0 and "the base model alone" in shown and "with the tenant's system prompt" in shown, shown
    print(
        f"\nlift of the pirate adapter: {report['lift']['pass_rate']:+.2f} pass rate "
        f"({report['lift']['loglik']} loglik) over the base alone "
        f"({report['base']['passed']}/{report['base']['total']}), {report['lift_prompted']['pass_rate']:+.2f} over "
        f"the base with the system prompt ({report['base_prompted']['passed']}/{report['base_prompted']['total']})"
    )

    # the maintainer points its tenant's "prod" alias at the adapter (the gateway serves it below)
    alias = await registry_proc.client.post(
        f"/v1/tenants/{tenant}/aliases",
        json={"name": "prod", "adapter": "support"},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert alias.status_code == 201, alias.text

    # --- the maintainer is refused on another tenant and on limits
    status, output = await lpx_as(registry_proc, token, "dataset", "list", other)
    assert status == 1 and f"may act only on tenant '{tenant}'" in output, output
    status, output = await lpx_as(registry_proc, token, "tenant", "limits", tenant, "--rps", "5")
    assert status == 1 and "needs the admin scope" in output, output

    # --- the inference key: answered by the gateway, refused by the registry
    await make_worker("walk-worker")
    gateway = ServedGateway(gateway_settings(connections))
    gateway.start()
    try:
        await gateway.wait_workers(1)
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=api_key, max_retries=0, timeout=240)
        chat = await asyncio.to_thread(client.chat.completions.create, model="prod", messages=QUESTION, max_tokens=24)
        answer = chat.choices[0].message.content
        assert "Ahoy" in answer, answer
        async with httpx.AsyncClient(timeout=30) as http:
            as_maintainer = await http.get(f"{gateway.url}/v1/models", headers={"Authorization": f"Bearer {token}"})
            assert as_maintainer.status_code == 401
            on_registry = await http.get(
                f"{registry_proc.url}/v1/tenants/{tenant}/datasets", headers={"Authorization": f"Bearer {api_key}"}
            )
            assert on_registry.status_code == 401 and "for the gateway" in on_registry.text, on_registry.text
    finally:
        gateway.stop()

    # --- the audit trail, read by the maintainer: every step with the credential that made it
    status, output = await lpx_as(registry_proc, token, "audit", tenant, "--json")
    assert status == 0, output
    entries = json.loads(output[output.index("[") :])
    by_action: dict[str, set] = {}
    for e in entries:
        by_action.setdefault(e["action"], set()).add((e["actor"], e["scope"]))
    assert by_action["tenant.created"] == {("bootstrap-admin", "admin")}
    assert by_action["credential.created"] == {("bootstrap-admin", "admin")}
    assert ("bootstrap-admin", "admin") in by_action["version.pushed"]  # the trainer's credential
    for step in ("dataset.stored", "tenant.value_check", "train.requested", "alias.created"):
        assert by_action[step] == {("walk-ml", "maintainer")}, (step, by_action)
    # the gate's pass is the activation: one entry by the gate, the version active after it
    verdicts = [e for e in entries if e["action"] == "version.verdict"]
    assert [(e["actor"], e["scope"], e["after"]["status"]) for e in verdicts] == [("eval-gate", "service", "active")]
    assert "tenant.limits" not in by_action  # the refused change left nothing
    print("audit: " + ", ".join(f"{e['action']} by {e['actor']} ({e['scope']})" for e in entries))
