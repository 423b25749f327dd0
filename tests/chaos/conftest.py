"""Chaos harness: a whole platform on a stack of its own (so its broker can be killed without touching
the session's), all REAL: NATS JetStream (one node, or a 3-node cluster), PostgreSQL and S3 started
by the stack launcher; the registry with two tenants and activated tone adapters; two in-process
workers on the session's vLLM engine; the gateway served by uvicorn. Drills run a mixed load through
it (sync HTTP and async NATS submissions), break something, and report what happened. The report of
every drill is printed at the end of the run and written to bench-results/chaos.json."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from libs.settings import ConnectionSettings
from tests.chaos.load import DrillReport

BASE = "smollm2-135m"
POOL = "chaos-smollm2-r16"
_REPORTS: list[DrillReport] = []


@dataclass
class Platform:
    stack: object
    connections: ConnectionSettings
    registry: object
    gateway: object  # tests.e2e.gateway.conftest.ServedGateway
    workers: list
    tenant_a: str
    tenant_b: str
    key_a: str  # tenant A: model "support" -> pirate tone
    key_b: str  # tenant B: model "concierge" -> formal tone
    digest_a: str
    digest_b: str

    async def restart_broker(self) -> None:
        """Start whatever NATS node is down again (same ports, same store dir)."""
        await asyncio.to_thread(self.stack.up)

    async def kill(self, server: str) -> None:
        await asyncio.to_thread(self.stack.kill_server, server)

    async def on_gateway(self, make_coro):
        """Run a coroutine of the gateway's on its own event loop (it is served in another thread)."""
        loop = self.gateway.gateway.loop
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(make_coro(), loop))

    async def jetstream(self):
        """A JetStream context on a connection of the test's own (never the services')."""
        import nats

        nc = await nats.connect(servers=self.connections.nats_servers)
        return nc, nc.jetstream()


def _new_stack(nats_nodes: int):
    from libs.stack import Stack, StackConfig

    state = Path(tempfile.mkdtemp(prefix=f"lpx-chaos-{nats_nodes}n-"))
    os.chmod(state, 0o755)
    stack = Stack(StackConfig(dir=state, start_timeout_s=90, nats_nodes=nats_nodes))
    stack.up()
    return stack, state


async def _activate(registry, tenant: str, adapter: str, path) -> str:
    reply = await registry.push(tenant, adapter, path)
    assert reply.status_code == 201, reply.text
    number = reply.json()["version"]["number"]
    url = f"/v1/tenants/{tenant}/adapters/{adapter}/versions/{number}/activate"
    reply2 = await registry.client.post(url, json={"actor": "chaos", "reason": "chaos fixture"})
    assert reply2.status_code == 200, reply2.text
    return reply.json()["version"]["digest"]


@pytest.fixture(scope="module")
async def platform_of(engine, base_model_path, tmp_path_factory):
    """`await platform_of(nats_nodes)`: the whole platform on a fresh stack; torn down with the module."""
    from services.worker.app import Worker
    from tests.adapters import tone_adapter
    from tests.conftest import operator_view
    from tests.e2e.gateway.conftest import ServedGateway, gateway_settings
    from tests.e2e.worker.conftest import worker_settings
    from tests.integration.registry.conftest import create_database, registry_settings, running_registry

    teardown: list = []

    async def build(nats_nodes: int) -> Platform:
        stack, state = await asyncio.to_thread(_new_stack, nats_nodes)
        teardown.append(lambda: _down(stack, state))
        conn = operator_view(ConnectionSettings.load(stack.env_file), stack.env_file)
        dsn = await create_database(conn)
        registry_cm = running_registry(registry_settings(conn, dsn))
        registry = await registry_cm.__aenter__()
        suffix = uuid.uuid4().hex[:6]
        a, b = f"chaos-a-{suffix}", f"chaos-b-{suffix}"
        key_a, key_b = await registry.create_tenant(a), await registry.create_tenant(b)
        digest_a = await _activate(registry, a, "support", tone_adapter(base_model_path, "pirate"))
        digest_b = await _activate(registry, b, "concierge", tone_adapter(base_model_path, "formal"))
        tmp = tmp_path_factory.mktemp(f"chaos-{nats_nodes}n")
        workers = []
        for wid in ("chaos-w1", "chaos-w2"):
            # Heartbeats as deployed (10 s TTL and staleness, the defaults): in a 3-node cluster the
            # memory R3 heartbeat bucket takes ~6 s to elect a leader after its leader dies, and beats
            # cannot be written meanwhile. With 3 s the gateway judged every worker gone mid-election
            # (README, "Surviving the broker": staleness must exceed that election).
            settings = worker_settings(
                conn, tmp, wid, pool=POOL, capacity=8, heartbeat_interval_s=0.5, heartbeat_ttl_s=10
            )
            worker = Worker(settings, engine=engine)
            await worker.start()
            workers.append(worker)
        gateway = ServedGateway(
            gateway_settings(conn, request_timeout_s=90.0, publish_retry_s=30.0, heartbeat_staleness_s=10.0)
        )
        gateway.start()
        await gateway.wait_workers(2)
        platform = Platform(stack, conn, registry, gateway, workers, a, b, key_a, key_b, digest_a, digest_b)
        teardown.append(lambda: _stop(platform, registry_cm))
        return platform

    yield build
    for step in reversed(teardown):
        result = step()
        if asyncio.iscoroutine(result):
            await result


def _down(stack, state: Path) -> None:
    """Stop the drill's stack; fail if a service user hit a NATS permission violation meanwhile."""
    from tests.conftest import service_violations

    violations = service_violations(state)
    stack.down()
    shutil.rmtree(state, ignore_errors=True)
    assert not violations, "service users hit NATS permission violations:\n" + "\n".join(violations[:20])


async def _stop(platform: Platform, registry_cm) -> None:
    platform.gateway.stop()
    for worker in platform.workers:
        if not worker._stopping.is_set():
            await asyncio.wait_for(worker.drain(), 120)
    await registry_cm.__aexit__(None, None, None)


@pytest.fixture(scope="session")
def chaos_report():
    """Collects one DrillReport per drill; printed and written when the session ends."""
    return _REPORTS


def pytest_terminal_summary(terminalreporter):
    if not _REPORTS:
        return
    from tests.chaos.load import render_table

    terminalreporter.section("chaos drills")
    terminalreporter.write_line(render_table(_REPORTS))
    out = Path(os.environ.get("LPX_BENCH_OUT", "bench-results"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "chaos.json").write_text(json.dumps([asdict(r) for r in _REPORTS], indent=2))
    terminalreporter.write_line(f"written to {out / 'chaos.json'}")
