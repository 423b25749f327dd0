"""The batch share on the real engine: a calm tenant's request beside a flood that fills the worker
starts at once (past the batch limit) instead of waiting behind the flood's generations, and is answered
with its own adapter; with the share off (FIFO) the same request waits behind the flood."""

from __future__ import annotations

import asyncio

from tests.e2e.worker.conftest import UploadedAdapter

Q = "Where is my order?"
FLOOD = 20


async def _answered_before(client, worker_id: str, flood: UploadedAdapter, calm: UploadedAdapter, worker) -> tuple:
    """Send the flood, wait until it fills the worker, send one calm request; returns (flood results
    that arrived before the calm one, the calm result)."""
    flood_ids = await asyncio.gather(
        *(client.send(worker_id, flood, Q, max_tokens=16, tenant_id="flood") for _ in range(FLOOD))
    )
    for _ in range(600):  # the flood fills the batch before the calm request comes
        if _filled(worker):
            break
        await asyncio.sleep(0.05)
    assert _filled(worker), "the flood never filled the worker"
    calm_id = await client.send(worker_id, calm, Q, max_tokens=16, tenant_id="calm")
    results = await client.wait([*flood_ids, calm_id])
    arrival = list(client.results)
    before = sum(1 for rid in flood_ids if arrival.index(rid) < arrival.index(calm_id))
    assert all(results[rid].ok for rid in flood_ids)
    return before, results[calm_id]


def _filled(worker) -> bool:
    """The flood holds every place: with a batch share, its running sequences (a request counts there only
    once its adapter is loaded, so taken-from-JetStream is not enough: a calm request whose adapter the
    engine already holds would overtake a flood still loading its own and start below the limit);
    without one, the worker's pull bound."""
    if worker.batch_share is not None:
        return worker.batch_share.total >= worker.batch_share.limit
    return worker.in_flight >= worker.settings.capacity


async def test_a_calm_tenant_starts_beside_a_flood_and_waits_behind_it_without_the_share(make_worker, client, noise):
    flood, calm = noise[0], noise[1]
    await make_worker("w-alone")
    rid = await client.send("w-alone", calm, Q, max_tokens=16, tenant_id="calm")
    alone = (await client.wait([rid]))[rid].text

    shared = await make_worker("w-shared")  # defaults: the batch share is on
    assert shared.batch_share is not None and shared.capacity.limit > shared.settings.capacity
    before, result = await _answered_before(client, "w-shared", flood, calm, shared)
    assert result.ok and result.text == alone and result.adapter_digest_applied == calm.ref.digest
    assert shared.batch_share.stats.protected_admissions >= 1  # it started past the limit
    assert before < FLOOD - shared.settings.capacity  # not behind the flood's later generations
    assert shared.batch_share.total == 0 and shared.batch_share.waiting == 0

    fifo = await make_worker("w-fifo", latency_guard=False)
    assert fifo.batch_share is None and fifo.capacity.limit == fifo.settings.capacity
    before_fifo, result = await _answered_before(client, "w-fifo", flood, calm, fifo)
    assert result.ok and result.text == alone
    assert before_fifo >= FLOOD - fifo.settings.capacity  # it waited in JetStream behind the flood
