"""The pool's load bound held by the workers (services/worker/load_bound.py), with real NATS and two
simulated worker processes: a burst routed to one worker (what two gateways choosing in the same
instant can do) is split at the bound, every request is answered exactly once, and at no moment a
worker took a request while its load was over ceil(c * (m + 1) / n)."""

from __future__ import annotations

import asyncio
import functools
import uuid

import nats
import pytest

from libs.contracts import InferenceRequest, InferenceResult, SamplingParams, subjects
from libs.fleetview.sources import read_heartbeats
from libs.routing import DEFAULT_BALANCE_FACTOR, load_bound
from tests.integration.fleet.conftest import POOL

pytestmark = pytest.mark.integration  # simulated engines: no vLLM

BURST = 12


def acceptance_violations(results: list[InferenceResult], workers: int, c: float) -> int:
    """Requests a worker took (fetched_at) while its load, counted from every request's span on the
    workers (fetched_at to result_sent_at), would go over the bound."""
    spans = [(r.worker_id, r.timings.fetched_at, r.timings.result_sent_at) for r in results]
    violations = 0
    for worker, at, _ in spans:
        mine = sum(1 for w, a, d in spans if w == worker and a < at < d)
        total = sum(1 for _, a, d in spans if a < at < d)
        violations += mine + 1 > load_bound(total, workers, c)
    return violations


async def test_a_burst_to_one_worker_is_split_at_the_bound_and_answered_once(fleet, connections):
    for worker in ("sim-0", "sim-1"):
        fleet.start_worker(worker)
    await fleet.wait_ready(2)
    await asyncio.sleep(1.5)  # each has heard the other's load report since (one before every 0.5 s beat)

    nc = await nats.connect(connections.nats_url, **connections.nats_auth("admin"))
    js = nc.jetstream()
    results: dict[str, list[InferenceResult]] = {}
    await nc.subscribe(subjects.RESULTS_ALL, cb=functools.partial(_collect, results))
    try:
        ids = []
        for _ in range(BURST):
            rid = f"bound-{uuid.uuid4().hex[:10]}"
            request = InferenceRequest(
                request_id=rid,
                tenant_id="tenant-bound",
                base_model=fleet.spec.base_model,
                messages=[{"role": "user", "content": "hello"}],
                sampling=SamplingParams(max_tokens=100),  # 0.5 s at the simulated 200 tok/s
            )
            await js.publish(
                subjects.infer(POOL, "sim-0", "base"), request.model_dump_json().encode(), headers={"Nats-Msg-Id": rid}
            )
            ids.append(rid)
        for _ in range(120):
            if all(rid in results for rid in ids):
                break
            await asyncio.sleep(0.25)
        await asyncio.sleep(1.0)  # a second answer, were there one, has arrived by now
        assert sorted(results) == sorted(ids), "a request was lost"
        assert all(len(answers) == 1 for answers in results.values()), "a request was answered twice"
        answers = [answers[0] for answers in results.values()]
        assert all(r.ok for r in answers)
        by = {w: sum(r.worker_id == w for r in answers) for w in ("sim-0", "sim-1")}
        assert by["sim-1"] > 0, f"nothing was passed on: {by}"
        assert acceptance_violations(answers, 2, DEFAULT_BALANCE_FACTOR) == 0
        await asyncio.sleep(1.0)  # a heartbeat since (every 0.5 s)
        beats = (await read_heartbeats(js)).beats
        assert beats["sim-0"].bound_passed_on >= by["sim-1"], "sim-1 answered more than sim-0 passed on"
    finally:
        await nc.close()


async def _collect(results: dict, msg) -> None:
    result = InferenceResult.model_validate_json(msg.data)
    results.setdefault(result.request_id, []).append(result)
