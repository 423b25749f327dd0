"""The `lpx demo` flow: the platform end to end on local defaults, with real servers and processes.

1. the base model;  2. the local platform (`lpx up`: the stack, the registry, the trainer, the eval
gate, a worker and the gateway, supervised; it keeps running after the demo);  3. each demo tenant's
dataset (shipped as JSONL in libs/demo/data) is stored, a training job per tenant goes over the
JetStream work queue to the trainer (peft), which pushes the adapter to the registry; the eval gate
(vLLM) evaluates it and only a pass activates it;  4. a mixed batch through the gateway with the
official `openai` client: each tenant's adapter and the base model in the same engine batch, each
answer's applied digest checked by the gateway against the one the registry resolved.

A second run re-uses what is there: tenants get a fresh key, the datasets are the same content, and a
tenant whose adapter already passed the gate on its dataset is not retrained.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from libs.demo.tenants import TENANTS

Log = Callable[[str], None]
POOL = "smollm2-135m-r16"
BASE = "smollm2-135m"
QUESTION = "Where is my order?"
TRAIN_STEPS, TRAIN_BATCH, TRAIN_SEED = 12, 2, 11


@dataclass
class Answer:
    who: str
    model: str
    text: str
    digest: str | None  # what the worker applied, checked by the gateway against the registry's digest
    seconds: float


def register_tenants(http: httpx.Client, log: Log) -> tuple[dict[str, str], dict[str, dict]]:
    """Tenants and their datasets. Returns (tenant -> API key, tenant -> dataset row)."""
    keys, datasets = {}, {}
    for tenant in TENANTS:
        created = http.post("/v1/tenants", json={"name": tenant.name})
        if created.status_code == 409:  # a previous demo run: issue a fresh key
            created = http.post(f"/v1/tenants/{tenant.name}/keys")
        created.raise_for_status()
        keys[tenant.name] = created.json()["api_key"]
        stored = http.post(
            "/v1/datasets",
            data={"tenant": tenant.name, "name": "support-data"},
            files={"file": (tenant.dataset.name, tenant.dataset.read_bytes())},
        )
        if stored.status_code not in (200, 201):
            raise RuntimeError(f"dataset of {tenant.name} refused: {stored.text}")
        datasets[tenant.name] = stored.json()
        log(
            f"{tenant.name}: dataset {tenant.dataset.name} ({stored.json()['train_examples']} train examples, "
            f"{stored.json()['eval_cases']} eval cases, sha256 {stored.json()['digest'][:12]})"
        )
    return keys, datasets


def already_gated(http: httpx.Client, tenant: str, adapter: str) -> dict | None:
    """The adapter's serving version when it passed the gate on the demo dataset (re-runs skip training)."""
    reply = http.get(f"/v1/tenants/{tenant}/aliases/{adapter}")
    if reply.status_code != 200:
        return None
    row = reply.json()
    return row if row["status"] == "active" and row["dataset"] == "support-data" and row["eval_report"] else None


async def train_all(nats_url: str, datasets: dict[str, dict], skip: set[str], log: Log) -> dict[str, int]:
    """One TrainJob per tenant on the work queue; follows the trainer's progress. Returns versions."""
    import nats
    from nats.js.api import DeliverPolicy

    from libs.contracts import DatasetRef, TrainJob, TrainProgress, subjects
    from libs.settings import ConnectionSettings

    nc = await nats.connect(nats_url, **ConnectionSettings.load().nats_auth("admin"))
    versions: dict[str, int] = {}
    try:
        js = nc.jetstream()
        for tenant in TENANTS:
            if tenant.name in skip:
                continue
            row = datasets[tenant.name]
            job = TrainJob(
                tenant=tenant.name,
                adapter=tenant.adapter,
                base_model=BASE,
                steps=TRAIN_STEPS,
                batch_size=TRAIN_BATCH,
                seed=TRAIN_SEED,
                requested_by="lpx demo",
                dataset=DatasetRef(
                    **{k: row[k] for k in ("name", "digest", "object_key", "train_examples", "eval_cases")}
                ),
            )
            sub = await js.subscribe(
                subjects.train_progress(job.job_id), ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
            )
            await js.publish(subjects.TRAIN_JOBS, job.model_dump_json().encode(), headers={"Nats-Msg-Id": job.job_id})
            log(f"{tenant.name}: training job {job.job_id[:8]} queued ({tenant.tone} tone, {TRAIN_STEPS} steps)")
            async for msg in sub.messages:
                event = TrainProgress.model_validate_json(msg.data)
                if event.loss is not None and event.step % 4 == 0:
                    log(f"  {tenant.name}: step {event.step}/{event.total_steps} loss {event.loss:.3f}")
                if event.done:
                    if event.error:
                        raise RuntimeError(f"training {tenant.name} failed: {event.error}")
                    log(
                        f"{tenant.name}: pushed {tenant.adapter}-v{event.version} (sha256 {event.digest[:12]}); "
                        f"awaiting the eval gate"
                    )
                    versions[tenant.name] = event.version
                    break
            await sub.unsubscribe()
    finally:
        await nc.drain()
    return versions


def wait_for_verdicts(http: httpx.Client, versions: dict[str, int], log: Log, timeout_s: float = 600) -> None:
    adapter = {t.name: t.adapter for t in TENANTS}
    deadline = time.monotonic() + timeout_s
    waiting = dict(versions)
    while waiting and time.monotonic() < deadline:
        for tenant, number in list(waiting.items()):
            row = http.get(f"/v1/tenants/{tenant}/aliases/{adapter[tenant]}-v{number}").json()
            if row["status"] in ("active", "rejected"):
                report = row["eval_report"] or {}
                cand, alone, lift = report.get("candidate") or {}, report.get("base"), report.get("lift")
                value = ""
                if alone and lift:  # what the adapter adds over the base model alone on the same cases
                    value = f"; base model alone {alone['passed']}/{alone['total']}, lift {lift['pass_rate']:+.2f}"
                log(
                    f"{tenant}: eval gate {row['status'].upper()} v{number} "
                    f"({cand.get('passed', 0)}/{cand.get('total', 0)} eval cases{value}) - {row['status_reason'][:140]}"
                )
                if row["status"] != "active":
                    raise RuntimeError(f"{tenant}'s adapter did not pass the gate: {row['status_reason']}")
                del waiting[tenant]
        time.sleep(1.0)
    if waiting:
        raise TimeoutError(f"no verdict within {timeout_s:.0f}s for {sorted(waiting)}")


async def ask_everyone(gateway_url: str, keys: dict[str, str], log: Log) -> list[Answer]:
    """One concurrent batch through the gateway with the official OpenAI client: each tenant asks its
    own adapter (alias `support`), and someone asks the base model; the vLLM worker batches them."""
    from openai import AsyncOpenAI

    plan = [(t.name, t.adapter, keys[t.name]) for t in TENANTS] + [("acme", BASE, keys["acme"])]

    async def ask(who: str, model: str, key: str) -> Answer:
        client = AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key=key, timeout=300, max_retries=0)
        started = time.monotonic()
        reply = await client.chat.completions.create(
            model=model, max_tokens=40, temperature=0, messages=[{"role": "user", "content": QUESTION}]
        )
        await client.close()
        return Answer(
            who if model != BASE else "(base model)",
            model,
            reply.choices[0].message.content.strip(),
            reply.system_fingerprint,
            time.monotonic() - started,
        )

    started = time.monotonic()
    answers = await asyncio.gather(*(ask(*p) for p in plan))
    log(f"mixed batch of {len(answers)} answered through the gateway in {time.monotonic() - started:.1f}s")
    return list(answers)


def run(platform, log: Log) -> tuple[list[Answer], object | None]:
    """The demo against the running local platform (`lpx up`): tenants, datasets, training through the
    trainer, the eval gate's verdicts, then one mixed batch through the gateway; its answers and the
    fleet's snapshot (libs.fleetview.FleetSnapshot) taken during it."""
    ends = platform.endpoints()
    admin = ends.admin_token_file.read_text().strip()
    with httpx.Client(base_url=ends.registry_url, headers={"Authorization": f"Bearer {admin}"}, timeout=60) as http:
        keys, datasets = register_tenants(http, log)
        skip = {t.name for t in TENANTS if already_gated(http, t.name, t.adapter)}
        for name in sorted(skip):
            log(f"{name}: adapter already trained on this dataset and passed the gate; not retrained")
        versions = asyncio.run(train_all(_nats_url(), datasets, skip, log))
        wait_for_verdicts(http, versions, log)
    registry = (ends.registry_url, {"Authorization": f"Bearer {admin}"})
    metrics = [ends.gateway_metrics_url] if ends.gateway_metrics_url else []
    return asyncio.run(ask_and_watch(ends.gateway_url, keys, log, registry, metrics))


async def ask_and_watch(
    gateway_url: str,
    keys: dict[str, str],
    log: Log,
    registry: tuple[str, dict[str, str]] | None = None,
    metrics: list[str] | None = None,
) -> tuple[list[Answer], object | None]:
    """The mixed batch, and one `lpx top` snapshot of the fleet taken while it is in flight (None when the
    view could not be read: the demo goes on without it); `registry` (URL, headers) names its adapters,
    `metrics` (the gateway's Prometheus URLs) adds each tenant's HTTP statuses."""
    from libs.fleetview import FleetCollector

    collector = FleetCollector(_nats_url(), registry=registry, metrics_urls=metrics or [])
    snapshot = None
    batch = asyncio.ensure_future(ask_everyone(gateway_url, keys, log))
    try:
        await collector.start()
        await asyncio.sleep(1.0)  # the requests reach the worker
        snapshot = await collector.sample_over(1.0)
    except Exception as exc:
        log(f"no fleet view ({exc})")
    finally:
        await collector.close()
    return await batch, snapshot


def _nats_url() -> str:
    from libs.settings import ConnectionSettings

    return ConnectionSettings.load().nats_url
