"""PostgreSQL killed mid-run (SIGKILL of the whole server, as a machine crash would) and restarted:
no event is lost, none is duplicated in the stream, and no half-written version exists.

The registry runs on its own PostgreSQL here (NATS and S3 are the session stack's), killed twice:
between the upload and the commit of a push, and while the outbox relay has published an event but
not yet marked it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections import Counter
from pathlib import Path

import httpx
import psutil
import pytest
from sqlalchemy import text

from libs.lora.format import adapter_digest
from libs.objectstore import adapter_prefix
from libs.stack import procs
from libs.stack.servers import PostgresServer, ServerContext
from services.registry.context import FaultHooks
from services.registry.orphans import sweep_orphans
from tests.integration.registry import adapters
from tests.integration.registry.conftest import registry_settings, running_registry
from tests.integration.registry.events import adapter_events, wait_until

pytestmark = pytest.mark.integration


class OwnPostgres:
    """A PostgreSQL server of this test alone, which it can kill and restart."""

    def __init__(self) -> None:
        # Under /tmp and world-traversable: PostgreSQL runs as `postgres` when the tests run as root.
        self.state = Path(tempfile.mkdtemp(prefix="lpx-pg-crash-"))
        os.chmod(self.state, 0o755)
        ctx = ServerContext(
            self.state, {"postgres": procs.free_port()}, {"pg_password": secrets.token_urlsafe(12)}, bucket="unused"
        )
        self.server = PostgresServer(ctx)
        self.proc: subprocess.Popen | None = None

    @property
    def dsn(self) -> str:
        return self.server.endpoint()

    def start(self) -> None:
        self.server.prepare()
        with open(self.server.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.server.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                user=self.server.run_as(),
                start_new_session=True,
                cwd=self.server.dir,
            )
        assert procs.wait_until(self.server.healthy, 60), self.server.log_path.read_text()[-2000:]
        self.server.after_healthy()

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend at once. Backends call setsid(), so a process-group
        kill would miss them: they are collected as the postmaster's children first."""
        postmaster = psutil.Process(self.proc.pid)
        every = [postmaster, *postmaster.children(recursive=True)]
        for process in every:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)
        psutil.wait_procs(every, timeout=30)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            procs.terminate(self.proc.pid, self.server.stop_signal)
        shutil.rmtree(self.state, ignore_errors=True)


class KillOnce:
    """A fault hook that kills PostgreSQL the first time it fires after being armed."""

    def __init__(self, pg: OwnPostgres) -> None:
        self.pg, self.armed, self.fired = pg, False, 0

    def __call__(self, *_args) -> None:
        if self.armed:
            self.armed = False
            self.fired += 1
            self.pg.kill()


@pytest.fixture
def own_postgres():
    pg = OwnPostgres()
    pg.start()
    yield pg
    pg.stop()


async def ready(registry) -> bool:
    return (await registry.client.get("/readyz")).status_code == 200


async def push_until_accepted(registry, tenant: str, directory: Path) -> httpx.Response:
    """What a client does with an idempotent push: retry while the registry answers 503."""

    async def attempt():
        reply = await registry.push(tenant, "crashy", directory)
        return reply if reply.status_code != 503 else None

    reply = await wait_until(attempt, timeout_s=60, interval_s=0.5)
    assert reply is not None and reply.status_code in (200, 201), reply and reply.text
    return reply


async def test_postgres_killed_mid_run_loses_no_event_and_leaves_no_half_version(
    own_postgres, connections, adapter_dirs, tmp_path
):
    good = adapter_dirs["good"]
    a, b, c, d = (adapters.variant(good, tmp_path / name, alpha=40 + i) for i, name in enumerate("abcd"))
    commit_killer, relay_killer = KillOnce(own_postgres), KillOnce(own_postgres)
    tenant = f"crash-{uuid.uuid4().hex[:8]}"
    settings = registry_settings(connections, own_postgres.dsn)
    async with running_registry(settings, hooks=FaultHooks(before_commit=commit_killer)) as registry:
        await registry.create_tenant(tenant)
        assert (await registry.push(tenant, "crashy", a)).status_code == 201

        # 1. Killed after the upload, inside the version's transaction, before its commit.
        commit_killer.armed = True
        refused = await registry.push(tenant, "crashy", b)
        assert commit_killer.fired == 1
        assert refused.status_code == 503 and refused.json()["error"] == "unavailable", refused.text
        own_postgres.start()
        assert await wait_until(lambda: ready(registry), timeout_s=30)
        history = (await registry.client.get(f"/v1/tenants/{tenant}/adapters/crashy/versions")).json()
        assert [v["digest"] for v in history] == [adapter_digest(a)]  # nothing of b was committed
        await sweep_orphans(registry.ctx, grace_s=0)  # b's object, if left behind, is swept
        assert not registry.ctx.store.exists(adapter_prefix(adapter_digest(b)) + "adapter_config.json")

        # 2. Killed while the relay has published an event but not marked it as published.
        registry.service.relay.after_publish = relay_killer
        relay_killer.armed = True
        first = await registry.push(tenant, "crashy", c)  # committed; a 503 means killed while answering
        assert first.status_code in (201, 503), first.text
        assert await wait_until(lambda: _fired(relay_killer), timeout_s=30)
        own_postgres.start()
        for directory in (c, b, d):
            await push_until_accepted(registry, tenant, directory)

        rows = await wait_until(lambda: _all_published(registry), timeout_s=60)
        assert rows, "outbox rows left unpublished after the relay recovered"
        counts = Counter(msg_id for msg_id, _ in await adapter_events(connections.nats_url, tenant))
        assert {event_id: counts[event_id] for event_id in rows} == {event_id: 1 for event_id in rows}
        assert sum(counts.values()) == len(rows)  # and nothing in the stream that the outbox doesn't hold
        await _check_versions(registry, tenant, [a, c, b, d], tmp_path)


async def _fired(killer: KillOnce) -> bool:
    return killer.fired == 1


async def _all_published(registry) -> list[str] | None:
    try:
        async with registry.ctx.engine.connect() as conn:
            rows = (await conn.execute(text("SELECT event_id, published_at IS NOT NULL FROM outbox"))).all()
    except Exception:
        return None
    return [event_id for event_id, published in rows] if rows and all(p for _, p in rows) else None


async def _check_versions(registry, tenant: str, pushed: list[Path], tmp_path: Path) -> None:
    """Exactly the pushed contents, numbered in push order, each with its object and one registered event."""
    history = (await registry.client.get(f"/v1/tenants/{tenant}/adapters/crashy/versions")).json()
    assert [v["digest"] for v in history] == [adapter_digest(p) for p in pushed]
    for version in history:
        fetched = registry.ctx.store.get_adapter(version["digest"], version["object_key"], tmp_path / version["digest"])
        assert adapter_digest(fetched) == version["digest"]
    events = await adapter_events(registry.settings.connections.nats_url, tenant)
    registered = Counter(e.version for _, e in events if e.kind == "registered")
    assert registered == Counter(v["number"] for v in history)
