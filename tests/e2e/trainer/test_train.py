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


async def answer(engine, spec: AdapterSpec | None, question: str) -> str:
    request = GenerationRequest(request_id=f"t-{question[:8]}-{spec.digest[:8] if spec else 'base'}",
                                messages=[{"role": "user", "content": question}], max_tokens=24, adapter=spec)
    return "".join([chunk.text async for chunk in engine.generate(request)])


async def test_lpx_train_produces_an_adapter_that_passes_the_gate(registry_proc, gate_a, engine, store, tmp_path):
    tenant = await registry_proc.new_tenant("train", None)
    data = tmp_path / "support-data.jsonl"
    write_jsonl(data, tone_dataset("pirate"))
    assert (await registry_proc.lpx("dataset", "push", tenant, str(data)))[0] == 0
    trainer = TrainerProcess(registry_proc, "trainer-one", tmp_path / "trainer.log",
                             LPX_TRAINER_WORK_DIR=str(tmp_path / "work"))  # fmt: skip
    try:
        await trainer.wait_ready()
        status, output = await registry_proc.lpx("train", tenant, "--dataset", "support-data", "--steps", "12",
                                                 "--batch-size", "2", "--seed", "3")  # fmt: skip
    finally:
        trainer.stop()
    assert status == 0, output
    assert f"trained and pushed {tenant}/support-v1" in output and "eval cases: 5/5 passed" in output, output
    row = await registry_proc.version(tenant, "support")
    assert row["status"] == "active" and row["dataset"] == "support-data" and row["number"] == 1
    # It changes the answers as intended: the pirate tone on a question it never saw, the base does not.
    path = store.get_adapter(row["digest"], row["object_key"], tmp_path / "pulled")
    tuned = await answer(engine, AdapterSpec(row["digest"], path), "Do you sell gift cards?")
    plain = await answer(engine, None, "Do you sell gift cards?")
    assert "Ahoy" in tuned and "Ahoy" not in plain, (tuned, plain)
