"""A base-model migration end to end, all real: three tenants serve on SmolLM2 (base A); base B is
derived from it (permuted residual stream + a short continued training: same shapes, but A's adapters
do not transfer). `lpx migrate start` retrains every tenant on B from its stored dataset; the trainer
is SIGKILLed half way and restarted, and resumes without redoing finished tenants; the eval gate of
base B compares each new version with the old one; aliases move to B only on pass; the tenant that
fails stays on A and is listed; both bases then serve side by side through the gateway."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import nats
import pytest
from nats.js.errors import NotFoundError

from libs.contracts import TrainProgress, subjects
from libs.engine import AdapterSpec, EngineConfig, create_engine
from libs.paths import lpx_home
from tests.e2e.eval_gate.conftest import gate_settings
from tests.e2e.gateway.conftest import ServedGateway, gateway_settings
from tests.e2e.trainer.conftest import TrainerProcess, tone_dataset, wait_for
from tests.e2e.trainer.test_train import answer
from tests.e2e.worker.conftest import worker_settings
from tests.integration.registry.events import stream_messages

pytestmark = pytest.mark.e2e
BASE_A, BASE_B = "smollm2-135m", "smollm2-derived"


@pytest.fixture(scope="module")
def base_b(base_model_path) -> Path:
    from libs.models.derive import derive_base

    return derive_base(base_model_path, lpx_home() / "test-artifacts" / "models" / BASE_B, seed=5, steps=4)


@pytest.fixture(scope="module")
def models_root(base_model_path, base_b, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("models")
    (root / BASE_A).symlink_to(base_model_path)
    (root / BASE_B).symlink_to(base_b)
    return root


def stubborn_dataset() -> list[dict]:
    """Trains the pirate tone but its eval cases want French: no version of it ever passes the gate."""
    train = [line for line in tone_dataset("pirate") if line.get("split", "train") == "train"]
    evals = [
        {
            "split": "eval",
            "id": f"fr-{i}",
            "criterion": "contains",
            "expected": "Bonjour",
            "messages": [{"role": "user", "content": q}],
        }
        for i, q in enumerate(["Hello?", "Where is my order?"])
    ]
    return train + evals


async def progress_events(nats_url: str, job_id: str) -> list[TrainProgress]:
    msgs = await stream_messages(nats_url, subjects.TRAIN_PROGRESS_STREAM, subjects.train_progress(job_id))
    return [TrainProgress.model_validate_json(m.data) for m in msgs]


async def last_progress(nats_url: str, job_id: str) -> TrainProgress | None:
    nc = await nats.connect(nats_url)
    try:
        stored = await nc.jetstream().get_last_msg(subjects.TRAIN_PROGRESS_STREAM, subjects.train_progress(job_id))
        return TrainProgress.model_validate_json(stored.data)
    except NotFoundError:
        return None
    finally:
        await nc.close()


async def test_migration_survives_a_trainer_crash_and_moves_only_passing_tenants(
    registry_proc, gate_a, connections, engine, tones, store, base_b, models_root, tmp_path
):
    reg = registry_proc
    config = json.loads((base_b / "config.json").read_text())
    assert (await reg.client.post("/v1/base-models", json={"name": BASE_B, "config": config})).status_code == 201
    # --- three tenants serving on base A --------------------------------------------------------
    pirate = await reg.new_tenant("mig-a", tone_dataset("pirate"))
    formal = await reg.new_tenant("mig-b", tone_dataset("formal"))
    stubborn = await reg.new_tenant("mig-c", stubborn_dataset())
    for tenant, tone in ((pirate, "pirate"), (formal, "formal"), (stubborn, "pirate")):
        pushed = await reg.client.post(
            "/v1/adapters",
            data={"tenant": tenant, "adapter": "support", "base_model": BASE_A, "dataset": "support-data"},
            files=[("files", (p.name, p.read_bytes())) for p in sorted(tones[tone].path.iterdir())],
        )
        assert pushed.status_code == 201, pushed.text

    async def decided(tenant):
        row = await reg.version(tenant, "support-v1")
        return row if row["status"] in ("active", "rejected") else None

    assert (await wait_for(lambda: decided(pirate), 120, what="pirate verdict"))["status"] == "active"
    assert (await wait_for(lambda: decided(formal), 120, what="formal verdict"))["status"] == "active"
    assert (await wait_for(lambda: decided(stubborn), 120, what="stubborn verdict"))["status"] == "rejected"
    override = await reg.client.post(
        f"/v1/tenants/{stubborn}/adapters/support/versions/1/activate",
        json={"actor": "e2e", "reason": "serves on A despite its French eval set"},
    )
    assert override.status_code == 200

    # --- plan and start --------------------------------------------------------------------------
    status, output = await reg.lpx("migrate", "plan", "--from", BASE_A, "--to", BASE_B, "--steps", "16")
    assert status == 0 and "3 of 3 adapters retrainable" in output and "GPU-hours" in output, output
    trainer_env = {
        "LPX_TRAINER_MODELS_ROOT": str(models_root),
        "LPX_TRAINER_ACK_WAIT_S": "10",
        "LPX_TRAINER_WORK_DIR": str(tmp_path / "work"),
    }
    first = TrainerProcess(reg, "trainer-first", tmp_path / "trainer.log", **trainer_env)
    second = None
    try:
        await first.wait_ready()
        status, output = await reg.lpx(
            "migrate", "start", "--from", BASE_A, "--to", BASE_B, "--steps", "16", "--batch-size", "2", "--seed", "7"
        )
        assert status == 0 and "started: 3 adapters" in output, output
        migration_id = output.split("migration ")[1].split()[0]
        migration = (await reg.client.get(f"/v1/migrations/{migration_id}")).json()
        jobs = [i["job_id"] for i in migration["items"]]
        assert [i["tenant"] for i in migration["items"]] == [pirate, formal, stubborn]

        # --- SIGKILL the trainer half way: the first tenant done, the second in training -----------
        async def half_way():
            # The second job's LAST progress event, not all of them: reading the whole subject lasts until it
            # is quiet for a while, which on a fast machine is after the job has trained and pushed.
            now = await last_progress(connections.nats_url, jobs[1])
            mid_training = now is not None and now.stage == "training" and 2 <= now.step <= now.total_steps - 4
            items = (await reg.client.get(f"/v1/migrations/{migration_id}")).json()["items"]
            return mid_training and items[0]["new_version"] is not None and items[1]["new_version"] is None

        await wait_for(half_way, 400, interval_s=0.1, what="the first tenant pushed and the second training")
        first.kill()
        during = (await reg.client.get(f"/v1/migrations/{migration_id}")).json()
        assert not during["done"] and during["items"][1]["new_version"] is None
        status, output = await reg.lpx("migrate", "status", migration_id)
        assert status == 0 and "running" in output and migration_id in output, output

        second = TrainerProcess(reg, "trainer-second", tmp_path / "trainer.log", **trainer_env)

        async def all_trained():
            items = (await reg.client.get(f"/v1/migrations/{migration_id}")).json()["items"]
            return all(i["new_version"] is not None or i["state"] == "failed" for i in items)

        await wait_for(all_trained, 600, what="every tenant retrained")
    finally:
        first.kill()
        if second is not None:
            second.stop()
    # Each tenant was trained to completion exactly once; only the one interrupted started twice.
    started = [
        [e.trainer_id for e in await progress_events(connections.nats_url, j) if e.stage == "started"] for j in jobs
    ]
    pushed = [[e for e in await progress_events(connections.nats_url, j) if e.stage == "pushed"] for j in jobs]
    assert started[0] == ["trainer-first"] and started[1] == ["trainer-first", "trainer-second"], started
    assert started[2] == ["trainer-second"] and [len(p) for p in pushed] == [1, 1, 1], (started, pushed)

    # --- base B's eval gate decides; both bases serve side by side --------------------------------
    from services.eval_gate.app import EvalGate
    from services.worker.app import Worker

    engine_b = create_engine(EngineConfig(model_path=base_b, max_loras=2, max_cpu_loras=4))
    gate_b = EvalGate(
        gate_settings(
            connections, base_model=BASE_B, model_path=base_b, deliver_policy="all", work_dir=tmp_path / "gate-b"
        ),
        engine=engine_b,
    )
    workers, served = [], None
    try:
        await gate_b.start()

        async def finished():
            body = (await reg.client.get(f"/v1/migrations/{migration_id}")).json()
            return body if body["done"] else None

        final = await wait_for(finished, 400, what="the migration to finish")
        states = {i["tenant"]: i for i in final["items"]}
        assert {t: i["state"] for t, i in states.items()} == {pirate: "passed", formal: "passed", stubborn: "failed"}
        assert states[stubborn]["reason"].startswith("eval: pass rate 0.00"), states[stubborn]["reason"]
        status, output = await reg.lpx("migrate", "status", migration_id)
        assert status == 0 and "done" in output and f"staying on {BASE_A}: {stubborn}/support" in output, output

        for tenant, base in ((pirate, BASE_B), (formal, BASE_B), (stubborn, BASE_A)):
            resolved = (await reg.client.get(f"/v1/resolve/{tenant}/support")).json()
            assert resolved["ref"]["base_model"] == base, (tenant, resolved)
        report = (await reg.version(pirate, "support-v2"))["eval_report"]
        regression = next(c for c in report["checks"] if c["name"] == "regression")
        assert regression["status"] == "passed" and f"stored score, base {BASE_A}" in regression["detail"]

        # A's adapter does not transfer to B; the retrained one does.
        question = "Do you sell gift cards?"
        old = await answer(engine_b, AdapterSpec(tones["pirate"].ref.digest, tones["pirate"].path), question)
        new_row = await reg.version(pirate, "support")
        new_path = store.get_adapter(new_row["digest"], new_row["object_key"], tmp_path / "new-pirate")
        new = await answer(engine_b, AdapterSpec(new_row["digest"], new_path), question)
        assert "Ahoy" not in old and "Ahoy" in new, (old, new)

        # Pools per base, one gateway: each tenant is served on the base its alias resolves to.
        for worker_id, pool, base, eng in (
            ("mig-wa", "mig-a-r16", BASE_A, engine),
            ("mig-wb", "mig-b-r16", BASE_B, engine_b),
        ):
            worker = Worker(worker_settings(connections, tmp_path, worker_id, pool=pool, base_model=base), engine=eng)
            await worker.start()
            workers.append(worker)
        served = ServedGateway(gateway_settings(connections, base_models=[BASE_A, BASE_B]))
        served.start()
        await served.wait_workers(2)
        async with httpx.AsyncClient(base_url=served.url, timeout=300) as http:
            for tenant, worker_id in ((pirate, "mig-wb"), (stubborn, "mig-wa")):
                reply = await http.post(
                    "/v1/chat/completions",
                    headers={"Authorization": f"Bearer {reg.keys[tenant]}"},
                    json={"model": "support", "max_tokens": 16, "messages": [{"role": "user", "content": question}]},
                )
                assert reply.status_code == 200, reply.text
                assert reply.headers["x-lpx-worker"] == worker_id
                assert "Ahoy" in reply.json()["choices"][0]["message"]["content"]
    finally:
        if served is not None:
            served.stop()
        for worker in workers:
            await worker.drain()
        await gate_b.stop()
        await gate_b.close()
        await engine_b.shutdown()
