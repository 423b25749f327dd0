"""The active adapter set the registry keeps for the workers' placement, over the real servers: a version
is in the bucket once activated, out of it once retired; and what the bucket holds that the database does
not (written behind the registry's back, or left by a registry of another database) is removed; after a
broker SIGKILL and restart the registry carries on by itself."""

from __future__ import annotations

import asyncio
import time
import uuid

import nats
import pytest
from nats.js.errors import KeyNotFoundError

from libs.contracts import AdapterRef
from services.registry.active_set import active_set_bucket_config
from tests.integration.registry import adapters
from tests.integration.registry.conftest import create_database, registry_settings, running_registry

pytestmark = pytest.mark.integration


async def _until(predicate, what: str, timeout_s: float = 45.0, detail=lambda: ""):
    # 45 s: a registry starting on a loaded 2-core CI machine took over 15 s to its first round (CI of 3f64895).
    deadline = time.monotonic() + timeout_s
    while not (got := await predicate()):
        assert time.monotonic() < deadline, f"{what}: not reached in {timeout_s:.0f}s {detail()}"
        await asyncio.sleep(0.2)
    return got


def _publisher(registry) -> str:
    """What the registry's publisher did: a lagging set says whether rounds ran, failed or stopped."""
    publisher = registry.service.active_set
    task = next(t for t in registry.service._tasks if t.get_name() == "active-set")
    ended = f"ended ({task.exception() if not task.cancelled() else 'cancelled'})" if task.done() else "running"
    return f"(publisher: {publisher.rounds} rounds, {publisher.failures} failed, task {ended})"


async def _push_active(registry, tenant: str, path) -> dict:
    reply = await registry.push(tenant, "support", path)
    assert reply.status_code == 201, reply.text
    version = reply.json()["version"]
    url = f"/v1/tenants/{tenant}/adapters/support/versions/{version['number']}/activate"
    done = await registry.client.post(url, json={"actor": "active-set-test", "reason": "not the gate under test"})
    assert done.status_code == 200, done.text
    return version


async def test_activation_writes_and_retirement_deletes_the_version_in_the_active_set(connections, adapter_dirs, stack):
    good, root = adapter_dirs["good"], adapter_dirs["root"]
    nc = await nats.connect(connections.nats_url)
    try:
        kv = await nc.jetstream().create_key_value(active_set_bucket_config())  # as the registry provisions it
        stray = "f" * 64  # in the bucket before this registry starts, and no version of its database
        # Behind it, what earlier registries left (in CI, a hundred-odd versions of the fleet tests): the
        # bucket is read whole at start, and a read that came back empty never deleted the stray.
        others = [f"{i:064x}" for i in range(1, 151)]
        for digest in [*others, stray]:
            ref = AdapterRef(digest=digest, object_key="x/", base_model="b", rank=8)
            await kv.put(digest, ref.model_dump_json().encode())
        await kv.delete(others[0])  # a key whose last message is a delete is not a value

        async def value(digest: str) -> AdapterRef | None:
            try:
                return AdapterRef.model_validate_json((await kv.get(digest)).value)
            except KeyNotFoundError:
                return None

        async def gone(digest: str) -> bool:
            return await value(digest) is None

        settings = registry_settings(connections, await create_database(connections), active_set_every_s=1.0)
        async with running_registry(settings) as registry:
            await _until(
                lambda: gone(stray),
                "the stray value removed by the registry's first round",
                detail=lambda: _publisher(registry),
            )
            assert [d for d in others if not await gone(d)] == []
            tenant = f"active-{uuid.uuid4().hex[:6]}"
            await registry.create_tenant(tenant)
            v1 = await _push_active(registry, tenant, good)
            ref = await _until(lambda: value(v1["digest"]), "the activated version in the bucket")
            assert ref.base_model == "smollm2-135m" and ref.rank == 16 and ref.object_key

            v2 = await _push_active(registry, tenant, adapters.variant(good, root / "active-v2", alpha=40))
            await _until(lambda: value(v2["digest"]), "the second active version in the bucket")
            retired = await registry.client.post(
                f"/v1/tenants/{tenant}/adapters/support/versions/{v1['number']}/retire", json={"reason": "replaced"}
            )
            assert retired.status_code == 200, retired.text
            await _until(lambda: gone(v1["digest"]), "the retired version out of the bucket")
            assert await value(v2["digest"]) is not None

            # The broker SIGKILLed and back: the registry keeps the set going by itself.
            await asyncio.to_thread(stack.kill_server, "nats")
            await asyncio.sleep(1.0)
            await asyncio.to_thread(stack.up)
            v3 = await _push_active(registry, tenant, adapters.variant(good, root / "active-v3", alpha=44))
            await _until(lambda: value(v3["digest"]), "a version activated after the restart in the bucket", 60)
            assert await value(v2["digest"]) is not None and await gone(v1["digest"])
    finally:
        await nc.drain()
