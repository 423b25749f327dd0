"""Gateway end-to-end harness, all REAL: the session stack (NATS, PostgreSQL, S3), the registry
in-process with two tenants and activated tone adapters, in-process workers on the session's vLLM
engine (tests/e2e/worker fixtures), and the gateway app served by uvicorn on a free port in its own
thread, so the official `openai` client talks HTTP to it."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from dataclasses import dataclass

import httpx
import pytest

from tests.e2e.worker.conftest import BASE, POOL, client, make_worker, store, tones, worker_settings  # noqa: F401
from tests.integration.registry.conftest import registry_settings, running_registry

__all__ = ["BASE", "POOL", "worker_settings"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Tenants:
    a: str
    b: str
    key_a: str
    key_b: str
    digest_a: str  # tenant A's "support" (pirate tone)
    digest_b: str  # tenant B's "concierge" (formal tone)


async def _push_and_activate(registry, tenant: str, adapter: str, path) -> str:
    reply = await registry.push(tenant, adapter, path)
    assert reply.status_code == 201, reply.text
    version = reply.json()["version"]
    reply = await registry.client.post(
        f"/v1/tenants/{tenant}/adapters/{adapter}/versions/{version['number']}/activate",
        json={"actor": "e2e", "reason": "gateway e2e fixture"},
    )
    assert reply.status_code == 200, reply.text
    return version["digest"]


@pytest.fixture(scope="package")
def gateway_postgres():
    """The registry's own PostgreSQL (NATS and S3 are the session stack's), so that a test can kill it
    and restart it without touching anything else."""
    from tests.integration.registry.test_postgres_restart import OwnPostgres

    pg = OwnPostgres()
    pg.start()
    yield pg
    pg.stop()


@pytest.fixture(scope="package")
async def gateway_registry(connections, gateway_postgres):
    # One registry for this package, torn down when it ends: every registry answers the same NATS
    # subjects (one queue group), so one left running would answer the registry tests' requests.
    async with running_registry(registry_settings(connections, gateway_postgres.dsn)) as running:
        yield running


@pytest.fixture(scope="package")
async def tenants(gateway_registry, tones) -> Tenants:  # noqa: F811
    suffix = uuid.uuid4().hex[:6]
    a, b = f"gw-a-{suffix}", f"gw-b-{suffix}"
    key_a, key_b = await gateway_registry.create_tenant(a), await gateway_registry.create_tenant(b)
    digest_a = await _push_and_activate(gateway_registry, a, "support", tones["pirate"].path)
    digest_b = await _push_and_activate(gateway_registry, b, "concierge", tones["formal"].path)
    return Tenants(a, b, key_a, key_b, digest_a, digest_b)


_RECORDER: dict = {}


def recording_telemetry():
    """Telemetry whose spans are kept in memory, shared by every gateway of the session and made the
    global provider once (the in-process worker records through the global one), so that one trace
    can be followed from HTTP through NATS to the worker. Its shutdown is a no-op: a gateway that stops
    must not stop the recording for the others."""
    if not _RECORDER:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        _RECORDER.update(provider=provider, exporter=exporter)
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from libs.telemetry import Telemetry

    class _Shared(Telemetry):
        def shutdown(self) -> None:
            self.meter_provider.shutdown()

    reader = InMemoryMetricReader()  # this gateway's own metrics
    telemetry = _Shared("gateway", _RECORDER["provider"], MeterProvider(metric_readers=[reader]))
    telemetry.metrics_reader = reader
    return telemetry, _RECORDER["exporter"]


class ServedGateway:
    """The real gateway app under uvicorn, in a thread with its own event loop."""

    def __init__(self, settings) -> None:
        import uvicorn

        from services.gateway.app import Gateway, create_app

        self.settings = settings
        telemetry, self.spans = recording_telemetry()
        self.metrics_reader = telemetry.metrics_reader
        self.app = create_app(settings, gateway=Gateway(settings, telemetry=telemetry))
        self.port = settings.port
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(
                self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on", access_log=False
            )
        )
        self.thread = threading.Thread(target=self.server.run, name="gateway", daemon=True)

    @property
    def gateway(self):
        return self.app.state.gateway

    def start(self, timeout: float = 30) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            assert self.thread.is_alive(), "the gateway thread died during start-up"
            assert time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    async def wait_workers(self, count: int, timeout: float = 30, *, including: tuple[str, ...] = ()) -> None:
        """Until the gateway's pool view has exactly `count` live workers, among them the ids in `including`.
        Why the ids: a worker an earlier test drained stays live until its heartbeat is stale, so a count
        alone can be met by that worker before the new one's first beat (a 503 "no live worker" in CI)."""
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(base_url=self.url) as http:
            while True:
                seen = (await http.get("/readyz")).json().get("workers")
                ids = set(self.gateway.pools.live) if self.gateway.started else set()
                if seen == count and ids.issuperset(including):
                    return
                assert time.monotonic() < deadline, f"gateway sees {seen} workers {sorted(ids)}, expected {count}"
                await asyncio.sleep(0.2)


def gateway_settings(connections, **overrides):
    from services.gateway.settings import GatewaySettings

    values = dict(
        port=free_port(),
        connections=connections,
        # 6 s (3 s before): on a 2-core CI machine running vllm serve beside the in-process worker, beats every
        # 0.5 s once went unseen for 3 s, and a parity request was answered 503 (CI of 44c1fdc).
        heartbeat_staleness_s=6.0,
        pool_poll_s=0.25,
        request_timeout_s=180.0,
        max_prompt_chars=4000,
        base_models=[BASE],
        drain_grace_s=5.0,
    )
    values.update(overrides)
    return GatewaySettings(**values)


@pytest.fixture(scope="package")
def gateway(connections, gateway_registry):
    served = ServedGateway(gateway_settings(connections))
    served.start()
    yield served
    served.stop()
