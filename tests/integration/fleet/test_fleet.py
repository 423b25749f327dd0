"""A small fleet as one system: 3 gateway processes, 8 simulated workers, 100 adapters pushed through
the registry; Zipf traffic over async NATS submissions and HTTP; mid-run one gateway and a quarter of
the workers are SIGKILLed. Every submission is answered exactly once, every answer comes from the
adapter its alias resolved to, and the dead workers' consumers are retired."""

from __future__ import annotations

import asyncio
import random
import time

import httpx
import pytest

from libs.contracts import subjects
from tests.integration.fleet.conftest import POOL

pytestmark = pytest.mark.integration  # simulated engines: no vLLM

GATEWAYS, WORKERS, KILLED_WORKERS = 3, 8, 2


def zipf_aliases(aliases: list[str], count: int, seed: int = 0, s: float = 1.0) -> list[str]:
    rng = random.Random(seed)
    weights = [1.0 / (rank + 1) ** s for rank in range(len(aliases))]
    return rng.choices(aliases, weights=weights, k=count)


async def _submit_all(client, key: str, plan: list[str], rate_per_s: float) -> list[tuple[str, str]]:
    sent = []
    for alias in plan:
        rid = await client.submit(
            alias, messages=[{"role": "user", "content": "hello"}], max_tokens=8, api_key=key, timeout_s=240
        )
        sent.append((rid, alias))
        await asyncio.sleep(1.0 / rate_per_s)
    return sent


async def _http_calls(urls: list[str], key: str, plan: list[str]) -> list[tuple[str, dict]]:
    out = []
    async with httpx.AsyncClient(timeout=120, headers={"Authorization": f"Bearer {key}"}) as http:
        for i, alias in enumerate(plan):
            body = {"model": alias, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
            reply = await http.post(f"{urls[i % len(urls)]}/v1/chat/completions", json=body)
            assert reply.status_code == 200, reply.text
            out.append((alias, reply.json()))
    return out


async def _stored_results_per_id(js, tenant: str, rids: list[str]) -> dict[str, int]:
    info = await js.stream_info(subjects.RESULTS_STREAM, subjects_filter=subjects.tenant_results_filter(tenant))
    counts = info.state.subjects or {}
    return {rid: counts.get(subjects.tenant_results(tenant, rid), 0) for rid in rids}


async def _usage_totals(registry, tenant: str, requests: int, timeout_s: float = 60) -> dict:
    """The registry's usage totals for `tenant` once it has counted `requests` requests."""
    deadline = time.monotonic() + timeout_s
    while True:
        totals = (await registry.client.get(f"/v1/tenants/{tenant}/usage", params={"since_hours": 2})).json()["totals"]
        if totals["requests"] >= requests or time.monotonic() > deadline:
            return totals
        await asyncio.sleep(0.5)


async def test_fleet_survives_a_gateway_and_a_quarter_of_the_workers(
    fleet, fleet_tenant, connections, gateway_registry
):
    from libs.client import LoraplexClient

    urls = [fleet.start_gateway(f"gw-{i}") for i in range(GATEWAYS)]
    for i in range(WORKERS):
        fleet.start_worker(f"sim-{i}")
    await fleet.wait_ready(WORKERS)
    aliases = sorted(fleet_tenant.aliases)
    async with LoraplexClient(connections.nats_url, api_key=fleet_tenant.key) as client:
        submitting = asyncio.create_task(_submit_all(client, fleet_tenant.key, zipf_aliases(aliases, 240), 40.0))
        http = asyncio.create_task(_http_calls(urls[1:], fleet_tenant.key, zipf_aliases(aliases, 40, seed=1)))
        await asyncio.sleep(2.0)
        fleet.kill(fleet.gateways["gw-0"][0])  # mid-run: a gateway ...
        for i in range(KILLED_WORKERS):  # ... and a quarter of the workers
            fleet.kill(fleet.workers[f"sim-{i}"])
        killed_at = time.monotonic()
        sent = await submitting
        results = await asyncio.gather(*(client.result(rid, timeout=240) for rid, _ in sent))
        answered_http = await http
        stored = await _stored_results_per_id(client.js, fleet_tenant.tenant, [rid for rid, _ in sent])

        lost = [rid for (rid, _), r in zip(sent, results, strict=True) if not r.ok]
        assert not lost, [r.error for r in results if not r.ok][:3]
        duplicated = {rid: n for rid, n in stored.items() if n != 1}
        assert not duplicated, duplicated  # exactly one stored answer per submission
        for (_rid, alias), result in zip(sent, results, strict=True):
            digest = fleet_tenant.aliases[alias]
            assert result.adapter_digest_applied == digest
            assert result.text.startswith(f"[sim adapter {digest[:12]}]"), result.text  # the engine's own word
        for alias, body in answered_http:
            digest = fleet_tenant.aliases[alias]
            assert body["system_fingerprint"] == digest
            assert body["choices"][0]["message"]["content"].startswith(f"[sim adapter {digest[:12]}]")

        # The dead workers' durable consumers are retired once their backlog was re-routed.
        for i in range(KILLED_WORKERS):
            durable = subjects.worker_durable(POOL, f"sim-{i}")
            while True:
                try:
                    await client.js.consumer_info(subjects.INFER_STREAM, durable)
                except Exception:
                    break
                assert time.monotonic() - killed_at < 60, f"consumer {durable} still there"
                await asyncio.sleep(0.5)
        survivors = {f"sim-{i}" for i in range(KILLED_WORKERS, WORKERS)}
        served = {r.worker_id for r in results}
        assert served & survivors and len(served) >= WORKERS - KILLED_WORKERS

    # Usage metering counted each request once, re-routed ones included: its totals are exactly the
    # tokens the callers got back.
    returned = [(r.prompt_tokens, r.completion_tokens) for r in results]
    returned += [(b["usage"]["prompt_tokens"], b["usage"]["completion_tokens"]) for _, b in answered_http]
    totals = await _usage_totals(gateway_registry, fleet_tenant.tenant, len(returned))
    assert totals == {
        "requests": len(returned),
        "prompt_tokens": sum(p for p, _ in returned),
        "completion_tokens": sum(c for _, c in returned),
        "errors": 0,
    }
