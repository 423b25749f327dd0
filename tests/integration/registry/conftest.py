"""Registry test harness: the registry runs in-process (FastAPI app through httpx's ASGI transport,
plus its relay, responder and eval consumer as asyncio tasks) against the REAL servers of the
session stack, each test module on a fresh database."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from libs.settings import ConnectionSettings
from tests.integration.registry import adapters

ADMIN_TOKEN = "test-admin-token"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

pytestmark = pytest.mark.integration


async def create_database(connections: ConnectionSettings) -> str:
    """A new, empty database on the stack's PostgreSQL; returns its DSN."""
    import asyncpg

    name = f"lpx_registry_{uuid.uuid4().hex[:12]}"
    admin_dsn = connections.pg_dsn.replace("postgresql+asyncpg://", "postgresql://")
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return connections.pg_dsn.rsplit("/", 1)[0] + "/" + name


def callout_seed(connections):
    from tests.conftest import callout_seed as seed_of

    return seed_of(connections)


def registry_settings(connections: ConnectionSettings, dsn: str, **overrides):
    from services.registry.settings import RegistrySettings

    conn = connections.model_copy(update={"pg_dsn": dsn})
    defaults = dict(
        admin_token=ADMIN_TOKEN,
        eval_durable=f"test-{uuid.uuid4().hex[:10]}",
        eval_deliver_policy="new",
        usage_durable=f"test-usage-{uuid.uuid4().hex[:10]}",
        usage_deliver_policy="new",
        outbox_poll_s=0.1,
        nats_callout_seed=callout_seed(connections),
    )
    return RegistrySettings(connections=conn, **{**defaults, **overrides})


@dataclass
class Registry:
    app: object
    client: httpx.AsyncClient
    settings: object

    @property
    def ctx(self):
        return self.app.state.ctx

    @property
    def service(self):
        return self.app.state.service

    async def push(
        self, tenant: str, adapter: str, directory: Path, base: str = "smollm2-135m", dataset: str | None = None
    ) -> httpx.Response:
        form = {"tenant": tenant, "adapter": adapter, "base_model": base, **({"dataset": dataset} if dataset else {})}
        return await self.client.post("/v1/adapters", data=form, files=adapters.files_of(directory))

    async def push_dataset(self, tenant: str, name: str, lines: list[dict]) -> httpx.Response:
        import json

        body = "".join(json.dumps(line) + "\n" for line in lines).encode()
        return await self.client.post(
            "/v1/datasets", data={"tenant": tenant, "name": name}, files={"file": (f"{name}.jsonl", body)}
        )

    async def create_tenant(self, name: str) -> str:
        reply = await self.client.post("/v1/tenants", json={"name": name})
        assert reply.status_code == 201, reply.text
        return reply.json()["api_key"]

    async def nats_credential(self, tenant: str) -> str:
        """A NATS credential for the tenant's own connection (the broker's auth callout checks it here)."""
        reply = await self.client.post(f"/v1/tenants/{tenant}/nats-credentials")
        assert reply.status_code == 201, reply.text
        return reply.json()["credential"]


@asynccontextmanager
async def running_registry(settings, hooks=None) -> AsyncIterator[Registry]:
    from services.registry.api import create_app

    app = create_app(settings, hooks=hooks)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://registry", headers=ADMIN, timeout=60
        ) as client:
            yield Registry(app, client, settings)


@pytest.fixture(scope="module")
async def registry_dsn(connections) -> str:
    return await create_database(connections)


@pytest.fixture(scope="module")
async def registry(connections, registry_dsn) -> AsyncIterator[Registry]:
    async with running_registry(registry_settings(connections, registry_dsn)) as running:
        yield running


@pytest.fixture(scope="session")
def adapter_dirs(tmp_path_factory, base_model_path) -> dict[str, Path]:
    """A real rank-16 PEFT adapter for SmolLM2 and a rank-64 one (about 5 s each, once a session)."""
    from libs.lora.train import LoraRecipe, random_adapter

    root = tmp_path_factory.mktemp("registry-adapters")
    good = random_adapter(base_model_path, root / "good", LoraRecipe(rank=16, seed=1))
    rank64 = random_adapter(base_model_path, root / "rank64", LoraRecipe(rank=64, alpha=128, seed=2))
    return {"good": good, "rank64": rank64, "root": root}


@pytest.fixture
def good_adapter(adapter_dirs) -> Path:
    return adapter_dirs["good"]
