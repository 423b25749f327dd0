"""Usage metering from the results (real NATS JetStream, PostgreSQL, the registry's durable consumer):
each request counted once however often its result arrives (a redelivery, a re-routed request's
second answer), per adapter and hour; errors counted; results that are nobody's usage skipped; a
malformed result dead-lettered while counting goes on."""

from __future__ import annotations

import asyncio
import uuid

import nats
import pytest

from libs.contracts import ErrorInfo, InferenceResult, new_id, subjects

pytestmark = pytest.mark.integration
DIGEST = "ab" * 32


async def publish(js, result: InferenceResult, subject: str | None = None, msg_id: str | None = None) -> None:
    headers = {"Nats-Msg-Id": msg_id or f"test-{uuid.uuid4().hex}"}
    await js.publish(subject or subjects.results(result.request_id), result.model_dump_json().encode(), headers=headers)


def counted(tenant: str, request_id: str, *, worker: str = "w1", prompt: int, completion: int) -> InferenceResult:
    """A worker's ok answer for `tenant`'s base model: one request to count."""
    return InferenceResult(
        request_id=request_id,
        worker_id=worker,
        ok=True,
        prompt_tokens=prompt,
        completion_tokens=completion,
        tenant=tenant,
        base_model="smollm2-135m",
    )


async def usage_of(registry, tenant: str, requests: int, timeout_s: float = 15) -> dict:
    for _ in range(int(timeout_s / 0.2)):
        reply = await registry.client.get(f"/v1/tenants/{tenant}/usage", params={"since_hours": 1})
        found = reply.json()
        if reply.status_code == 200 and found["totals"]["requests"] >= requests:
            return found
        await asyncio.sleep(0.2)
    raise AssertionError(f"usage of {tenant} did not reach {requests} requests: {found}")


async def test_each_request_is_counted_once_per_adapter_and_hour(registry, connections):
    tenant = f"use-{uuid.uuid4().hex[:8]}"
    await registry.create_tenant(tenant)
    nc = await nats.connect(connections.nats_url)
    js = nc.jetstream()
    try:
        rids = [new_id() for _ in range(5)]
        for i, rid in enumerate(rids):
            digest = DIGEST if i < 3 else None
            result = InferenceResult(
                request_id=rid,
                worker_id="w1",
                ok=True,
                prompt_tokens=10,
                completion_tokens=i + 1,
                tenant=tenant,
                adapter_digest=digest,
                base_model="smollm2-135m",
            )
            await publish(js, result, subjects.results_to("gw-a", rid))
        # The same requests answered again: a second worker after a re-route, a redelivery.
        for rid in rids[:2]:
            again = InferenceResult(
                request_id=rid,
                worker_id="w2",
                ok=True,
                prompt_tokens=10,
                completion_tokens=99,
                tenant=tenant,
                adapter_digest=DIGEST,
                base_model="smollm2-135m",
            )
            await publish(js, again)
        failed = InferenceResult(
            request_id=new_id(),
            worker_id="w1",
            ok=False,
            tenant=tenant,
            base_model="smollm2-135m",
            error=ErrorInfo(code="engine_error", message="boom"),
        )
        await publish(js, failed)
        nobody = InferenceResult(
            request_id=new_id(), worker_id="gateway", ok=False, error=ErrorInfo(code="bad_request", message="no tenant")
        )
        await publish(js, nobody)
        await js.publish(subjects.results(new_id()), b"{not json", headers={"Nats-Msg-Id": uuid.uuid4().hex})
        marker = InferenceResult(
            request_id=new_id(),
            worker_id="w1",
            ok=True,
            prompt_tokens=1,
            completion_tokens=1,
            tenant=tenant,
            base_model="smollm2-135m",
        )
        await publish(js, marker)  # after the malformed one: counting went on
    finally:
        await nc.drain()

    found = await usage_of(registry, tenant, requests=7)
    await asyncio.sleep(1.0)  # anything counted twice would show up by now
    found = await usage_of(registry, tenant, requests=7)
    totals = found["totals"]
    assert {k: v for k, v in totals.items() if k != "completion_tokens"} == {
        "requests": 7,
        "prompt_tokens": 5 * 10 + 1,
        "errors": 1,
    }
    # Each request is counted once, with whichever of its answers the consumer met first: normally the
    # first published, but a delivery nak'd (database busy) can be overtaken by the request's second one.
    first_only = (1 + 2 + 3 + 4 + 5) + 1
    assert totals["completion_tokens"] in {first_only, first_only - 1 + 99, first_only - 2 + 99, first_only - 3 + 99}
    by_adapter = {}
    for row in found["rows"]:
        by_adapter[row["adapter"]] = by_adapter.get(row["adapter"], 0) + row["requests"]
    assert by_adapter == {DIGEST[:12]: 3, "smollm2-135m": 4}  # digests of no version of this tenant stay digests
    assert all(row["hour"].endswith(":00:00Z") or "+00:00" in row["hour"] for row in found["rows"])
    cost = found["cost"]  # the registry of these tests sets no price nor report: both the planner's, labelled
    assert cost["gpu_price_source"].startswith("assumed") and cost["tok_s_source"].startswith("assumed")
    per_million = cost["gpu_price_per_hour"] / (cost["tok_s_per_gpu"] * 3600) * 1e6
    assert cost["usd_per_million_tokens"] == pytest.approx(per_million, rel=1e-4)
    assert cost["usd"] == pytest.approx(totals["completion_tokens"] / 1e6 * per_million, abs=1e-6)


async def test_a_result_the_table_cannot_hold_is_dead_lettered_and_the_rest_of_its_pull_counted(registry, connections):
    """A pull's results are counted in one INSERT; one row PostgreSQL refuses (a worker id longer than
    its column) must not take the others with it: they are counted, it alone goes to the dead letters."""
    from tests.integration.registry.events import dead_letters, wait_until

    tenant = f"use-{uuid.uuid4().hex[:8]}"
    await registry.create_tenant(tenant)
    before = len(await dead_letters(connections.nats_url))
    nc = await nats.connect(connections.nats_url)
    js = nc.jetstream()
    try:
        for i in range(7):  # published back to back: they reach the consumer in one pull
            worker = "w" * 80 if i == 3 else "w1"
            await publish(js, counted(tenant, new_id(), worker=worker, prompt=2, completion=1))
    finally:
        await nc.drain()

    found = await usage_of(registry, tenant, requests=6)
    assert found["totals"]["requests"] == 6

    async def dead_lettered():
        letters = await dead_letters(connections.nats_url)
        return [x for x in letters[before:] if "usage could not be recorded" in x.reason]

    letters = await wait_until(dead_lettered)
    assert len(letters) == 1
    await asyncio.sleep(1.0)
    assert (await usage_of(registry, tenant, requests=6))["totals"]["requests"] == 6


async def test_usage_of_an_unknown_tenant_is_404_and_a_bad_window_422(registry):
    assert (await registry.client.get("/v1/tenants/nobody-here/usage")).status_code == 404
    tenant = f"use-{uuid.uuid4().hex[:8]}"
    await registry.create_tenant(tenant)
    for bad in ("0", "-1", "1e9", "soon"):
        assert (
            await registry.client.get(f"/v1/tenants/{tenant}/usage", params={"since_hours": bad})
        ).status_code == 422


async def test_results_that_arrive_while_postgres_is_down_are_counted_once_it_is_back(connections):
    """PostgreSQL SIGKILLed: the usage consumer leaves the results in the stream (nak with a delay) and
    counts each exactly once after the restart, the registry's other work untouched."""
    from tests.integration.registry.conftest import registry_settings, running_registry
    from tests.integration.registry.test_postgres_restart import OwnPostgres

    pg = OwnPostgres()
    pg.start()
    try:
        async with running_registry(registry_settings(connections, pg.dsn)) as registry:
            tenant = f"pgu-{uuid.uuid4().hex[:8]}"
            await registry.create_tenant(tenant)
            pg.kill()
            nc = await nats.connect(connections.nats_url)
            js = nc.jetstream()
            try:
                rids = [new_id() for _ in range(5)]
                for rid in rids + rids[:2]:  # two of them answered twice (a re-route)
                    await publish(js, counted(tenant, rid, prompt=3, completion=4))
                await asyncio.sleep(2.0)  # the consumer meets the dead database meanwhile
            finally:
                await nc.drain()
            pg.start()
            found = await usage_of(registry, tenant, requests=5, timeout_s=60)
            await asyncio.sleep(1.0)
            found = await usage_of(registry, tenant, requests=5)
            assert found["totals"] == {"requests": 5, "prompt_tokens": 15, "completion_tokens": 20, "errors": 0}
    finally:
        pg.stop()
