"""Async submission over NATS through the real gateway with libs.client: a result kept on the results
stream, streaming deltas, resubmission of the same id never generating twice, refusals as error results."""

from __future__ import annotations

import asyncio

import pytest

from libs.client import LoraplexClient
from libs.contracts import InferenceResult, new_id

pytestmark = pytest.mark.e2e
QUESTION = [{"role": "user", "content": "Where is my order?"}]


async def test_submit_result_stream_and_no_double_generation(
    gateway, gateway_registry, tenants, make_worker, stack_nats_url
):
    worker = await make_worker("gw-sub")
    await gateway.wait_workers(1, including=("gw-sub",))
    # The tenant's own NATS credential: what a tenant's async client has, nothing more.
    creds = await gateway_registry.nats_credential(tenants.a)
    async with LoraplexClient(stack_nats_url, api_key=tenants.key_a, nats_credential=creds) as lpx:
        rid = await lpx.submit("support", messages=QUESTION, max_tokens=24)
        result = await lpx.result(rid, timeout=240)
        assert result.ok, result.error
        assert result.request_id == rid and "Ahoy" in result.text
        assert result.adapter_digest_applied == tenants.digest_a

        generated = worker.processor.generated_tokens
        answered = len(gateway.gateway.dispatcher._answered._ids)
        again = await lpx.submit("support", messages=QUESTION, max_tokens=24, request_id=rid)
        assert again == rid
        await asyncio.sleep(2.0)  # time for a (wrong) second generation to start
        assert worker.processor.generated_tokens == generated  # nothing generated twice
        assert len(gateway.gateway.dispatcher._answered._ids) == answered
        assert (await lpx.result(rid, timeout=5)).text == result.text  # still kept on the results stream

        sid = new_id()
        events = []

        async def consume():
            async for event in lpx.stream(sid, timeout=240):
                events.append(event)

        consumer = asyncio.create_task(consume())
        await asyncio.sleep(0.3)  # subscribed before the request starts
        await lpx.submit("support", messages=QUESTION, max_tokens=24, request_id=sid, stream=True)
        await asyncio.wait_for(consumer, 240)
        final = events[-1]
        assert isinstance(final, InferenceResult) and final.ok
        deltas = [e for e in events if isinstance(e, str)]
        assert len(deltas) > 2 and "".join(deltas) == final.text

        refused = await lpx.result(await lpx.submit("concierge", messages=QUESTION), timeout=60)  # tenant B's
        assert not refused.ok and refused.error.code == "model_not_found" and refused.worker_id == "gateway"
        bad_key = await lpx.result(await lpx.submit("support", messages=QUESTION, api_key="lpx_nope"), timeout=60)
        assert not bad_key.ok and bad_key.error.code == "invalid_api_key"
        # Tenant A's connection carrying tenant B's (valid) API key: the gateway refuses it, and A reads why.
        foreign = await lpx.result(await lpx.submit("concierge", messages=QUESTION, api_key=tenants.key_b), timeout=60)
        assert not foreign.ok and foreign.error.code == "permission_denied" and foreign.worker_id == "gateway"
