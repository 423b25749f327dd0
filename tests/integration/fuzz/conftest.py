"""A small live platform for the fuzz stage: the registry in-process with one tenant, a gateway process
and a worker process on the simulated engine (fast: a fuzzer's max_tokens of 8,192 answer in a fraction
of a second), on the session stack's NATS, PostgreSQL and S3."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest

from libs.fleet import Fleet, FleetSpec
from tests.integration.registry.conftest import Registry, create_database, registry_settings, running_registry

GATEWAY, WORKER = "fuzz-gw", "fuzz-sim-0"


@dataclass
class Platform:
    registry: Registry
    tenant: str
    key: str
    fleet: Fleet
    url: str  # the gateway

    @property
    def pool(self) -> str:
        return self.fleet.spec.pool


@pytest.fixture(scope="package")
async def platform(stack, connections, tmp_path_factory):
    async with running_registry(registry_settings(connections, await create_database(connections))) as registry:
        tenant = f"fuzz-{uuid.uuid4().hex[:6]}"
        key = await registry.create_tenant(tenant)
        spec = FleetSpec(pool=f"fuzz-{uuid.uuid4().hex[:6]}", capacity=8, decode_tok_s=200_000, prefill_tok_s=10**7)
        fleet = Fleet(env_file=stack.env_file, state=tmp_path_factory.mktemp("fuzz-platform"), spec=spec)
        url = fleet.start_gateway(GATEWAY, {"LPX_GATEWAY_REQUEST_TIMEOUT_S": "20"})
        fleet.start_worker(WORKER)
        try:
            await fleet.wait_ready(1)
            yield Platform(registry, tenant, key, fleet, url)
        finally:
            fleet.stop()
