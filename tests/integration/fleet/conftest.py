"""Fleet harness, all REAL but the engine: the session stack (NATS, PostgreSQL, S3), the registry
in-process with tenants and many small adapters pushed through it and activated, N gateway processes
(`python -m services.gateway`) and M simulated workers as processes (`python -m services.worker` with
LPX_WORKER_ENGINE=sim: the real worker code on the simulated engine), so processes can be SIGKILLed."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from libs.fleet import Fleet, FleetSpec
from tests.e2e.gateway.conftest import gateway_postgres, gateway_registry  # noqa: F401

POOL = FleetSpec().pool


@dataclass
class FleetTenants:
    key: str
    tenant: str
    aliases: dict[str, str]  # alias -> digest of its active version


async def push_many(registry, tenant: str, paths: list[Path], concurrency: int = 4) -> dict[str, str]:
    """Push and activate every adapter (admin override: the eval gate is not under test here)."""
    slots = asyncio.Semaphore(concurrency)

    async def one(i: int, path: Path) -> tuple[str, str]:
        alias = f"a{i:03d}"
        async with slots:
            reply = await registry.push(tenant, alias, path)
            assert reply.status_code == 201, reply.text
            version = reply.json()["version"]
            url = f"/v1/tenants/{tenant}/adapters/{alias}/versions/{version['number']}/activate"
            done = await registry.client.post(url, json={"actor": "fleet-test", "reason": "fleet fixture"})
            assert done.status_code == 200, done.text
        return alias, version["digest"]

    return dict(await asyncio.gather(*(one(i, p) for i, p in enumerate(paths))))


@pytest.fixture(scope="package")
async def fleet_tenant(gateway_registry, base_model_path) -> FleetTenants:  # noqa: F811
    from tests.adapters import tiny_adapters

    paths = await asyncio.to_thread(tiny_adapters, base_model_path, 100)
    tenant = f"fleet-{uuid.uuid4().hex[:6]}"
    key = await gateway_registry.create_tenant(tenant)
    return FleetTenants(key, tenant, await push_many(gateway_registry, tenant, paths))


@pytest.fixture
def fleet(stack, tmp_path):
    made = Fleet(env_file=stack.env_file, state=tmp_path, spec=FleetSpec(decode_tok_s=200.0))
    yield made
    made.stop()
