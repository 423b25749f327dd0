"""Eval gate end-to-end harness, all REAL: the session stack (NATS, PostgreSQL, S3), a registry
in-process on its own database, and the eval gate in-process on the session's vLLM engine (the kill
test runs gates as subprocesses with their own engines)."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path

import pytest

from tests.adapters import QUESTIONS, TONES, tone_examples
from tests.e2e.worker.conftest import store, tones  # noqa: F401
from tests.integration.registry.conftest import create_database, registry_settings, running_registry

BASE = "smollm2-135m"
UNSEEN = ["Can I pay with a credit card?", "What are your opening hours?", "Is this product in stock?"]


def tone_dataset(tone: str) -> list[dict]:
    """A tenant's dataset: the tone's training examples, and eval cases on questions seen in training
    and not, with each criterion."""
    answer = TONES[tone]
    marker = answer.split()[0].strip("!,")  # "Ahoy" / "Dear"
    evals = [
        {
            "split": "eval",
            "id": f"contains-{i}",
            "criterion": "contains",
            "expected": marker,
            "messages": [{"role": "user", "content": q}],
        }
        for i, q in enumerate(UNSEEN)
    ]
    evals.append(
        {
            "split": "eval",
            "id": "regex",
            "criterion": "regex",
            "expected": rf"(?i)\b{marker}\b",
            "messages": [{"role": "user", "content": QUESTIONS[0]}],
        }
    )
    evals.append(
        {
            "split": "eval",
            "id": "loglik",
            "criterion": "loglik",
            "min_score": -1.0,
            "messages": [{"role": "user", "content": UNSEEN[0]}, {"role": "assistant", "content": answer}],
        }
    )
    return tone_examples(answer) + evals


def gate_settings(connections, **overrides):
    from services.eval_gate.settings import EvalGateSettings

    defaults = dict(
        base_model=BASE,
        durable=f"test-gate-{uuid.uuid4().hex[:8]}",
        deliver_policy="new",
        ack_wait_s=15.0,
        parity_prompts=2,
    )
    return EvalGateSettings(connections=connections, **{**defaults, **overrides})


@pytest.fixture(scope="package")
async def gate_registry(connections):
    # Package-scoped and torn down with the package: registries share one NATS queue group.
    dsn = await create_database(connections)
    async with running_registry(registry_settings(connections, dsn)) as running:
        yield running


@pytest.fixture(scope="package")
async def gate(connections, engine, base_model_path, tmp_path_factory):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    from libs.telemetry import Telemetry
    from services.eval_gate.app import EvalGate

    settings = gate_settings(connections, model_path=base_model_path, work_dir=tmp_path_factory.mktemp("gate"))
    reader = InMemoryMetricReader()
    telemetry = Telemetry("eval-gate", TracerProvider(), MeterProvider(metric_readers=[reader]))
    service = EvalGate(settings, engine=engine, telemetry=telemetry)
    service.metric_reader = reader  # tests read the gate's metrics from here
    await service.start()
    yield service
    await service.stop()
    await service.close()


async def new_tenant(registry, prefix: str, tone: str | None = "pirate") -> str:
    """A tenant with a dataset for `tone` (train examples + eval cases), named `support-data`."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    await registry.create_tenant(name)
    if tone is not None:
        reply = await registry.push_dataset(name, "support-data", tone_dataset(tone))
        assert reply.status_code == 201, reply.text
    return name


async def wait_for_verdict(registry, tenant: str, adapter: str, number: int, timeout_s: float = 240) -> dict:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        row = (await registry.client.get(f"/v1/tenants/{tenant}/aliases/{adapter}-v{number}")).json()
        if row["status"] in ("active", "rejected"):
            return row
        await asyncio.sleep(0.5)
    raise AssertionError(f"no verdict for {tenant}/{adapter}-v{number} within {timeout_s}s (last: {row['status']})")


async def push(registry, tenant: str, adapter: str, path: Path, **kwargs) -> dict:
    reply = await registry.push(tenant, adapter, path, **kwargs)
    assert reply.status_code == 201, reply.text
    return reply.json()["version"]


def distinct_copy(src: Path, dest: Path, note: str, base: str | None = None) -> Path:
    """Same weights, different bytes (a config field changed): its own digest and S3 object, so a
    test can alter it without touching the adapters other tests share."""
    import json

    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "adapter_model.safetensors", dest / "adapter_model.safetensors")
    config = json.loads((src / "adapter_config.json").read_text())
    config["revision"] = note
    if base is not None:
        config["base_model_name_or_path"] = base
    (dest / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return dest


def metric_points(reader, name: str) -> dict[tuple, float]:
    """{sorted attribute items: value} of one metric (sums; histograms give their count)."""
    found = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != name:
                    continue
                for point in metric.data.data_points:
                    value = getattr(point, "value", None)
                    found[tuple(sorted(point.attributes.items()))] = value if value is not None else point.count
    return found
