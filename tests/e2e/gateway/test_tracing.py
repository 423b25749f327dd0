"""One trace from the HTTP request through NATS to the worker and back: the caller's traceparent is
continued by the gateway's HTTP span, its NATS publish span, and the worker's inference span."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from opentelemetry import trace

pytestmark = pytest.mark.e2e


async def test_one_trace_from_http_to_the_worker(gateway, tenants, make_worker):
    await make_worker("gw-trace")
    await gateway.wait_workers(1, including=("gw-trace",))
    # The worker records its spans through the global provider: it must be the recording one.
    assert trace.get_tracer_provider() is gateway.gateway.telemetry.tracer_provider, "another provider is global"
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    headers = {"Authorization": f"Bearer {tenants.key_a}", "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=240) as http:
        reply = await http.post(
            "/v1/chat/completions",
            headers=headers,
            json={"model": "support", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]},
        )
    assert reply.status_code == 200, reply.text
    rid = reply.headers["x-request-id"]
    await asyncio.sleep(0.5)
    spans = [s for s in gateway.spans.get_finished_spans() if format(s.context.trace_id, "032x") == trace_id]
    names = {s.name for s in spans}
    assert {"POST /v1/chat/completions", "gateway.publish", "worker.infer"} <= names, names
    worker_span = next(s for s in spans if s.name == "worker.infer")
    assert worker_span.attributes["lpx.request_id"] == rid
