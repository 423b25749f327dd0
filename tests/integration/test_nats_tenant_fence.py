"""Tenants fenced in on NATS, on the real nats-server with authorization on (one node and a 3-node
cluster): a tenant's credential may submit its own work and read its own answers; every other attempt
(another tenant's results, routed work, forged work, results or events, heartbeats, the JetStream API,
another tenant's submission subject) is refused by the server. A revoked credential is cut off within
a second; a service's credential cannot do another service's job."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import nats
import pytest

from libs.client import LoraplexClient
from libs.contracts import InferenceResult, subjects
from libs.settings import ConnectionSettings
from tests.conftest import operator_view
from tests.integration.registry.conftest import create_database, registry_settings, running_registry

pytestmark = pytest.mark.integration


class Probe:
    """A connection that records the server's refusals (nats-py reports them to error_cb)."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.received: list[str] = []
        self.nc = None

    async def connect(self, urls: list[str], **auth) -> Probe:
        async def on_error(exc: Exception) -> None:
            self.errors.append(str(exc))

        self.nc = await nats.connect(
            servers=urls, name="lpx-probe", error_cb=on_error, allow_reconnect=False, max_reconnect_attempts=0, **auth
        )
        return self

    async def refused(self, action) -> bool:
        """True when the server refused what `action` did (a permissions violation came back)."""
        before = len(self.errors)
        await action()
        await self.nc.flush()
        for _ in range(20):
            if len(self.errors) > before:
                return "permissions violation" in self.errors[-1].lower()
            await asyncio.sleep(0.05)
        return False

    async def subscribe(self, subject: str):
        async def got(msg) -> None:
            self.received.append(msg.subject)

        return await self.nc.subscribe(subject, cb=got)


async def _platform_on(conn: ConnectionSettings):
    dsn = await create_database(conn)
    return running_registry(registry_settings(conn, dsn))


@pytest.fixture(params=[1, 3], ids=["single-node", "3-node-cluster"])
async def fenced(request, stack, connections):
    """(operator connections, URLs without credentials, registry) on the session stack or a fresh cluster."""
    state = None
    if request.param == 1:
        conn = connections
        urls = ConnectionSettings.load(stack.env_file).nats_servers
    else:
        from libs.stack import Stack, StackConfig

        state = Path(tempfile.mkdtemp(prefix="lpx-fence-3n-"))
        state.chmod(0o755)
        cluster = Stack(StackConfig(dir=state, start_timeout_s=90, nats_nodes=3))
        await asyncio.to_thread(cluster.up)
        conn = operator_view(ConnectionSettings.load(cluster.env_file), cluster.env_file)
        urls = ConnectionSettings.load(cluster.env_file).nats_servers
    try:
        async with await _platform_on(conn) as registry:
            yield conn, urls, registry
    finally:
        if state is not None:
            await asyncio.to_thread(cluster.down)
            shutil.rmtree(state, ignore_errors=True)


async def _tenant(registry) -> tuple[str, str, str]:
    name = f"fence-{uuid.uuid4().hex[:8]}"
    key = await registry.create_tenant(name)
    return name, key, await registry.nats_credential(name)


async def test_a_tenant_credential_reaches_its_own_subjects_and_nothing_else(fenced):
    conn, urls, registry = fenced
    alice, alice_key, alice_creds = await _tenant(registry)
    bob, _, _ = await _tenant(registry)
    operator = await nats.connect(servers=conn.nats_servers)
    probe = await Probe().connect(
        urls, user=f"tenant:{alice}", password=alice_creds, inbox_prefix=subjects.tenant_inbox_prefix(alice).encode()
    )
    try:
        js = operator.jetstream()
        infer_before = (await js.stream_info(subjects.INFER_STREAM)).state.messages
        # What the tenant may do: its own results (live and stored) and its own submission subject.
        await probe.subscribe(subjects.tenant_results_filter(alice))
        await probe.nc.flush()
        await asyncio.sleep(0.2)  # on a cluster, the interest reaches the other nodes
        rid = uuid.uuid4().hex
        own = InferenceResult(request_id=rid, worker_id="gateway", ok=True, text="own").model_dump_json().encode()
        await js.publish(subjects.tenant_results(alice, rid), own)
        async with LoraplexClient(",".join(urls), api_key=alice_key, nats_credential=alice_creds) as client:
            stored = await client.js.get_last_msg(
                subjects.RESULTS_STREAM, subjects.tenant_results(alice, rid), direct=True
            )
            assert stored.data == own
            ack = await client.js.publish(subjects.submit(alice), b"{}", headers={"Nats-Msg-Id": uuid.uuid4().hex})
            assert ack.stream == subjects.SUBMIT_STREAM
        for _ in range(40):
            if probe.received:
                break
            await asyncio.sleep(0.05)
        assert subjects.tenant_results(alice, rid) in probe.received

        # Everything else is refused by the server, one attempt at a time.
        nc = probe.nc
        bob_rid = uuid.uuid4().hex
        attempts = {
            "read every result": lambda: probe.subscribe(subjects.RESULTS_ALL),
            "read another tenant's results": lambda: probe.subscribe(subjects.tenant_results_filter(bob)),
            "read routed work": lambda: probe.subscribe(subjects.INFER_ALL),
            "read token deltas of the fleet": lambda: probe.subscribe(subjects.TOKENS_ALL),
            "read lifecycle events": lambda: probe.subscribe(subjects.EVENTS_ALL),
            "read another client's inbox": lambda: probe.subscribe("_INBOX.>"),
            "forge routed work": lambda: nc.publish(subjects.infer("default", "w1", "base"), b"{}"),
            "submit as another tenant": lambda: nc.publish(subjects.submit(bob), b"{}"),
            "forge a result": lambda: nc.publish(subjects.results_to("gw-1", bob_rid), b"{}"),
            "forge a registry event": lambda: nc.publish(subjects.adapter_event("activated"), b"{}"),
            "forge a heartbeat": lambda: nc.publish(f"$KV.{subjects.HEARTBEAT_BUCKET}.w-fake", b"{}"),
            "ask the registry to resolve": lambda: nc.publish(subjects.RESOLVE, b"{}"),
            "read a stream through the JetStream API": lambda: nc.publish(
                f"$JS.API.STREAM.MSG.GET.{subjects.RESULTS_STREAM}", b'{"last_by_subj": "lpx.results.>"}'
            ),
            "direct-get another tenant's result": lambda: nc.publish(
                subjects.direct_get_last(subjects.RESULTS_STREAM, subjects.tenant_results(bob, bob_rid)), b""
            ),
            "delete a stream": lambda: nc.publish(f"$JS.API.STREAM.DELETE.{subjects.INFER_STREAM}", b""),
        }
        allowed = [what for what, action in attempts.items() if not await probe.refused(action)]
        assert not allowed, f"the broker let a tenant credential {allowed}"
        # Nothing was routed or stored, and nothing of the fleet reached the tenant.
        assert (await js.stream_info(subjects.INFER_STREAM)).state.messages == infer_before
        assert set(probe.received) == {subjects.tenant_results(alice, rid)}
    finally:
        await probe.nc.close()
        await operator.drain()


async def test_wrong_or_revoked_credentials_are_refused_and_cut_off(fenced):
    conn, urls, registry = fenced
    alice, alice_key, alice_creds = await _tenant(registry)
    bob, _, bob_creds = await _tenant(registry)
    for user, password in (
        (f"tenant:{alice}", bob_creds),
        (f"tenant:{alice}", "lpxn_nope"),
        (alice, alice_creds),
        (f"tenant:{alice}", alice_key),
    ):
        with pytest.raises(Exception, match="Authorization Violation"):
            await Probe().connect(urls, user=user, password=password)
    with pytest.raises(Exception, match="Authorization Violation"):
        await Probe().connect(urls)  # no credentials at all

    probe = await Probe().connect(
        urls, user=f"tenant:{alice}", password=alice_creds, inbox_prefix=subjects.tenant_inbox_prefix(alice).encode()
    )
    key_id = alice_creds.split("_")[2]
    revoked_at = time.monotonic()
    reply = await registry.client.post(f"/v1/tenants/{alice}/keys/{key_id}/revoke")
    assert reply.status_code == 200 and reply.json()["kind"] == "nats"
    while probe.nc.is_connected and time.monotonic() - revoked_at < 5:
        await asyncio.sleep(0.02)
    assert not probe.nc.is_connected and time.monotonic() - revoked_at < 1.0
    with pytest.raises(Exception, match="Authorization Violation"):
        await Probe().connect(urls, user=f"tenant:{alice}", password=alice_creds)
    listed = {k["key_id"]: k for k in (await registry.client.get(f"/v1/tenants/{alice}/keys")).json()}
    assert listed[key_id]["kind"] == "nats" and listed[key_id]["revoked_at"] and listed[key_id]["last_used_at"]


async def test_a_service_credential_does_only_its_own_job(fenced):
    conn, urls, _ = fenced
    worker = await Probe().connect(urls, **conn.nats_auth("worker"))
    gateway = await Probe().connect(urls, **conn.nats_auth("gateway"))
    try:
        assert await worker.refused(lambda: worker.nc.publish(subjects.adapter_event("activated"), b"{}"))
        assert await worker.refused(lambda: worker.nc.publish(subjects.submit("someone"), b"{}"))
        assert await worker.refused(lambda: worker.subscribe(subjects.EVENTS_ALL))
        assert await gateway.refused(lambda: gateway.nc.publish(subjects.adapter_event("activated"), b"{}"))
        assert await gateway.refused(
            lambda: gateway.nc.publish(f"$JS.API.STREAM.DELETE.{subjects.RESULTS_STREAM}", b"")
        )
        # ... while its own job goes through.
        assert not await worker.refused(lambda: worker.nc.publish(subjects.worker_load("default", "w1"), b"{}"))
    finally:
        await worker.nc.close()
        await gateway.nc.close()
