"""Datasets and training through the CLI and the trainer service: a malformed dataset is refused with
its line numbers and nothing is stored; `lpx train` trains a demo tenant's adapter on the trainer,
which pushes it; the eval gate passes it and it changes the answers as intended."""

from __future__ import annotations

import json

import pytest

from libs.engine import AdapterSpec, GenerationRequest
from tests.e2e.trainer.conftest import TrainerProcess, tone_dataset

pytestmark = pytest.mark.e2e


def write_jsonl(path, lines) -> None:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))


async def test_a_malformed_dataset_is_refused_with_line_numbers(registry_proc, tmp_path):
    tenant = await registry_proc.new_tenant("ds", None)
    good = tone_dataset("pirate")
    bad = tmp_path / "support.jsonl"
    write_jsonl(bad, [good[0], "{oops", {"messages": [{"role": "user", "content": "hi"}]}, good[1]])
    status, output = await registry_proc.lpx("dataset", "push", tenant, str(bad))
    assert status == 1, output
    assert "line 2: not JSON" in output and "line 3:" in output and "line 1:" not in output
    assert (await registry_proc.client.get(f"/v1/tenants/{tenant}/datasets")).json() == []
    write_jsonl(bad, good)
    status, output = await registry_proc.lpx("dataset", "push", tenant, str(bad), "--name", "support-data")
    assert status == 0 and "8 train examples, 5 eval cases" in output, output


async def _bad_jobs_are_handled(registry_proc, tenant: str, url: str):
    """A malformed job is dead-lettered; a job for a base the trainer lacks fails with a reason; the
    trainer keeps running."""
    import nats

    from libs.contracts import DatasetRef, DeadLetter, TrainJob, subjects
    from tests.e2e.trainer.conftest import wait_for
    from tests.integration.registry.events import stream_messages

    row = (await registry_proc.client.get(f"/v1/tenants/{tenant}/datasets")).json()[0]
    job = TrainJob(
        tenant=tenant,
        adapter="other",
        base_model="no-such-base",
        steps=1,
        dataset=DatasetRef(**{k: row[k] for k in ("name", "digest", "object_key")}),
    )
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.publish(subjects.TRAIN_JOBS, b'{"tenant": "x"}')
        await js.publish(subjects.TRAIN_JOBS, job.model_dump_json().encode())
    finally:
        await nc.drain()

    async def dead():
        msgs = await stream_messages(url, subjects.DLQ_STREAM, subjects.dead_letter("trainer"))
        found = [DeadLetter.model_validate_json(m.data) for m in msgs]
        return [d for d in found if d.payload == '{"tenant": "x"}']

    async def failed():
        from libs.contracts import TrainProgress

        msgs = await stream_messages(url, subjects.TRAIN_PROGRESS_STREAM, subjects.train_progress(job.job_id))
        events = [TrainProgress.model_validate_json(m.data) for m in msgs]
        return [e for e in events if e.done and e.error and "no-such-base" in e.error]

    letter = (await wait_for(dead, 30, what="the dead letter"))[0]
    await wait_for(failed, 30, what="the failed job")
    return letter


async def answer(engine, spec: AdapterSpec | None, question: str) -> str:
    request = GenerationRequest(
        request_id=f"t-{question[:8]}-{spec.digest[:8] if spec else 'base'}",
        messages=[{"role": "user", "content": question}],
        max_tokens=24,
        adapter=spec,
    )
    return "".join([chunk.text async for chunk in engine.generate(request)])


async def test_lpx_train_produces_an_adapter_that_passes_the_gate(
    registry_proc, gate_a, engine, store, connections, tmp_path
):
    tenant = await registry_proc.new_tenant("train", None)
    data = tmp_path / "support-data.jsonl"
    write_jsonl(data, tone_dataset("pirate"))
    assert (await registry_proc.lpx("dataset", "push", tenant, str(data)))[0] == 0
    trainer = TrainerProcess(
        registry_proc, "trainer-one", tmp_path / "trainer.log", LPX_TRAINER_WORK_DIR=str(tmp_path / "work")
    )
    try:
        await trainer.wait_ready()
        status, output = await registry_proc.lpx(
            "train", tenant, "--dataset", "support-data", "--steps", "12", "--batch-size", "2", "--seed", "3"
        )
        refused = await _bad_jobs_are_handled(registry_proc, tenant, connections.nats_url)
    finally:
        trainer.stop()
    assert refused.reason.startswith("malformed TrainJob"), refused
    assert status == 0, output
    assert f"trained and pushed {tenant}/support-v1" in output and "eval cases: 5/5 passed" in output, output
    row = await registry_proc.version(tenant, "support")
    assert row["status"] == "active" and row["dataset"] == "support-data" and row["number"] == 1
    status, report = await registry_proc.lpx("adapter", "report", f"{tenant}/support")
    assert status == 0 and "support-v1" in report and "parity (greedy)" in report, report
    for check in ("integrity", "structure", "load", "eval", "regression", "parity", "value"):
        assert check in report
    status, again = await registry_proc.lpx("adapter", "eval", f"{tenant}/support-v1")
    assert status == 1 and "push a new version" in again, again
    # It changes the answers as intended: the pirate tone on a question it never saw, the base does not.
    path = store.get_adapter(row["digest"], row["object_key"], tmp_path / "pulled")
    tuned = await answer(engine, AdapterSpec(row["digest"], path), "Do you sell gift cards?")
    plain = await answer(engine, None, "Do you sell gift cards?")
    assert "Ahoy" in tuned and "Ahoy" not in plain, (tuned, plain)
