"""Placement with the real services (simulated engines): the session stack, the registry in-process,
a gateway process and simulated worker processes.

- A version activated before the workers started and never requested is on its ring owners' disks (the
  first 2 of its ring order, the workers' default: the owner and the worker the bound spills to; the
  registry's active set); one activated while the pool runs is there before its first request, and that
  request is not served from the object store.
- The gateway's demand reaches the workers: a worker that joins fetches exactly its new share of the
  requested adapters (the moved share) and the others fetch nothing.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import pytest

from libs.contracts import AdapterRef, AdapterTier, subjects
from libs.fleet import FleetSpec
from libs.fleetview.sources import read_heartbeats
from libs.routing import HashRing
from services.registry.active_set import bucket_contents
from tests.integration.fleet.conftest import POOL, push_many

pytestmark = pytest.mark.integration  # simulated engines: no vLLM

PLACEMENT_POSITIONS = 2  # LPX_WORKER_PLACEMENT_POSITIONS, left at its default
FAST = {"LPX_WORKER_PLACEMENT_INTERVAL_S": "0.5", "LPX_WORKER_PLACEMENT_FETCH_PER_S": "50"}


async def _resident(js) -> dict[str, set[str]]:
    """Per live worker of the fleet's pool: every digest it holds, whatever the tier."""
    beats = (await read_heartbeats(js)).beats
    return {w: {d for ds in b.adapters.values() for d in ds} for w, b in beats.items() if b.pool == POOL}


async def _active(js) -> set[str]:
    """The registry's active versions a worker of the fleet's pool may serve (base model, rank)."""
    kv = await js.key_value(subjects.ACTIVE_ADAPTERS_BUCKET)
    # Read as the registry reads it: a watch until nats-py's "no more" marker can end before its first entry.
    refs = [AdapterRef.model_validate_json(v) for v in (await bucket_contents(js, kv)).values()]
    return {r.digest for r in refs if r.base_model == FleetSpec.base_model and r.rank <= 16}


async def _settled(js, workers: list[str]) -> bool:
    """Every worker's plan fetched: nothing in its backlog, everything it owns on its disk."""
    beats = (await read_heartbeats(js)).beats
    return all(
        w in beats and beats[w].placement_backlog == 0 and beats[w].placement_resident == beats[w].placement_owned
        for w in workers
    )


async def _until(predicate, what: str, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while True:
        got = await predicate()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not reached in {timeout_s:.0f}s"
        await asyncio.sleep(0.25)


def _owners(ring: HashRing, digest: str) -> set[str]:
    """The workers that place an adapter: the first LPX_WORKER_PLACEMENT_POSITIONS (2) of its ring order."""
    return set(ring.preference_list(digest)[:PLACEMENT_POSITIONS])


def _on_all(held: dict[str, set[str]], owners: set[str], digest: str) -> bool:
    return all(digest in held.get(w, set()) for w in owners)


async def _ask(url: str, key: str, aliases: list[str]) -> None:
    async with httpx.AsyncClient(timeout=60, headers={"Authorization": f"Bearer {key}"}) as http:
        for alias in aliases:
            body = {"model": alias, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            reply = await http.post(f"{url}/v1/chat/completions", json=body)
            assert reply.status_code == 200, reply.text


async def test_activation_preloads_and_a_joining_worker_fetches_only_its_share(
    fleet, fleet_tenant, connections, gateway_registry, base_model_path
):
    from libs.client import LoraplexClient
    from tests.adapters import tiny_adapters

    url = fleet.start_gateway("gw-0", {"LPX_GATEWAY_DEMAND_PUBLISH_S": "0.5"})
    workers = [f"sim-{i}" for i in range(3)]
    for worker in workers:
        fleet.start_worker(worker, FAST)
    await fleet.wait_ready(len(workers))
    await asyncio.sleep(2.0)  # every worker adopted the 3-worker ring (a change is adopted on its second sight)
    ring = HashRing(workers)

    async with LoraplexClient(connections.nats_url, api_key=fleet_tenant.key) as client:
        # 0. Versions activated before the workers started, and not requested yet: each is placed on its
        #    owners' disks (the registry's active set), so even its first request is not served from S3.
        async def tail_on_owners():
            held = await _resident(client.js)
            return all(_on_all(held, _owners(ring, d), d) for d in fleet_tenant.aliases.values())

        await _until(tail_on_owners, "the versions nobody asked for yet on their owners' disks", 30)

        # 1. Versions activated now: each is fetched by its owners at once, before anyone asks for it.
        paths = (await asyncio.to_thread(tiny_adapters, base_model_path, 106))[100:]
        tenant = f"place-{uuid.uuid4().hex[:6]}"
        key = await gateway_registry.create_tenant(tenant)
        fresh = await push_many(gateway_registry, tenant, paths)

        async def on_owners():
            held = await _resident(client.js)
            return all(_on_all(held, _owners(ring, digest), digest) for digest in fresh.values())

        await _until(on_owners, "every activated version on its owner's disk", 20)
        held = await _resident(client.js)
        for digest in fresh.values():  # and only there
            assert {w for w in workers if digest in held.get(w, set())} == _owners(ring, digest)
        await _ask(url, key, sorted(fresh))

        async def hits():
            beats = (await read_heartbeats(client.js)).beats
            tiers = [b.tier_hits for w, b in beats.items() if w in workers]
            return tiers if sum(sum(t.values()) for t in tiers) >= len(fresh) else None

        tier_hits = await _until(hits, "the requests counted in the beats", 10)
        assert sum(t.get(AdapterTier.OBJECT_STORE, 0) for t in tier_hits) == 0, tier_hits

        # 2. Demand: the fleet tenant's adapters are asked for once each; once every worker holds its whole
        #    share (the requested ones and every other active version), a fourth worker joins.
        await _ask(url, fleet_tenant.key, sorted(fleet_tenant.aliases))
        await asyncio.sleep(1.5)  # the gateway publishes its counts
        await _until(lambda: _settled(client.js, workers), "every worker holding its whole share", 60)
        before = await _resident(client.js)
        fleet.start_worker("sim-3", FAST)
        await fleet.wait_ready(4)
        grown = HashRing([*workers, "sim-3"])
        placed = set(fleet_tenant.aliases.values()) | set(fresh.values()) | await _active(client.js)
        moved = {d for d in placed if "sim-3" in _owners(grown, d)}
        assert len(moved) > 10  # about a quarter of 106 at least

        async def joined():
            held = await _resident(client.js)
            return held if moved <= held.get("sim-3", set()) else None

        held = await _until(joined, "the joining worker holding its share", 30)
        assert held["sim-3"] == moved  # its share, nothing else: fetched bytes = the moved share
        for worker in workers:  # the others fetched nothing new
            assert held[worker] <= before[worker], worker
