"""Cross-replica tenant limits (services/gateway/limit_sync.py) across a broker restart: two gateway
replicas, each a LimitSync with its own TenantLimiter on its own BrokerLink (as the gateway builds
them), talk through a REAL nats-server of this test's own (never the session stack's). The server is
SIGKILLed and restarted on the same port; nothing else is restarted. While it is away each replica
counts alone (the other's in-flight count decays after `remote_stale_s`: limits fail open); once it
is back the reports flow again by themselves, so a replica again sees, and is limited by, the other's
requests in flight, and sees them end."""

from __future__ import annotations

import logging
import time

import pytest

from libs.bus.link import BrokerLink
from libs.contracts import TenantLimits
from libs.settings import ConnectionSettings
from services.gateway.limit_sync import LimitSync
from services.gateway.limits import RateLimited, TenantLimiter
from tests.integration.test_broker_link import OwnNats, _until

pytestmark = pytest.mark.integration

TENANT = "t-sync"
ONE_AT_A_TIME = TenantLimits(concurrency=1)


@pytest.fixture
def nats_server(tmp_path):
    server = OwnNats(tmp_path / "js")
    server.start()
    yield server
    server.kill()


class Replica:
    """What one gateway replica holds for its limits: link, limiter, sync (as services/gateway/app.py)."""

    def __init__(self, url: str, gateway_id: str) -> None:
        self.link = BrokerLink(ConnectionSettings(nats_url=url, nats_allow_open=True), f"t-{gateway_id}")
        self.limiter = TenantLimiter(TenantLimits())
        self.gateway_id = gateway_id
        self.sync: LimitSync | None = None

    async def start(self) -> None:
        nc = await self.link.connect(give_up_after_s=15)
        self.sync = LimitSync(nc, self.limiter, self.gateway_id, interval_s=0.1)
        await self.sync.start()

    async def stop(self) -> None:
        if self.sync is not None:
            await self.sync.stop()
        await self.link.close()


def _refused(replica: Replica) -> bool:
    try:
        ticket = replica.limiter.admit(TENANT, ONE_AT_A_TIME, 10)
    except RateLimited:
        return True
    replica.limiter.release(ticket, 0)
    return False


async def test_limit_reports_converge_again_after_a_broker_restart(nats_server, caplog):
    caplog.set_level(logging.INFO, logger="libs.bus")
    a, b = Replica(nats_server.url, "gw-a"), Replica(nats_server.url, "gw-b")
    await a.start()
    await b.start()
    try:
        # Before: A's request in flight is seen at B, and B is held to the tenant's limit by it.
        ticket = a.limiter.admit(TENANT, ONE_AT_A_TIME, 10)
        await _until(lambda: b.limiter.others_in_flight(TENANT) == 1, 5)
        assert _refused(b)

        nats_server.kill()
        killed_at = time.monotonic()
        await _until(lambda: not a.link.connected and not b.link.connected, 10)
        heard_while_up = b.sync.reports_received

        # Away: B hears nothing; A's count is dropped once it is stale (not at once): fail open.
        await _until(lambda: b.limiter.others_in_flight(TENANT) == 0, b.limiter.remote_stale_s + 3)
        decayed_after = time.monotonic() - killed_at
        assert decayed_after > b.limiter.remote_stale_s - 1.0, decayed_after
        assert b.sync.reports_received == heard_while_up
        assert not _refused(b)  # B admits on its own count alone
        assert a.limiter.in_flight(TENANT) == 1  # A's own count never depended on the broker

        # Back on the same port: both links reconnect and the reports resume by themselves.
        nats_server.start()
        await _until(lambda: a.link.connected and b.link.connected, 20)
        await _until(lambda: b.limiter.others_in_flight(TENANT) == 1, 20)
        assert b.sync.reports_received > heard_while_up
        assert _refused(b)  # the limit holds across replicas again

        # A's request ends: B sees it by a report (well before a stale count would expire).
        a.limiter.release(ticket, 5)
        released_at = time.monotonic()
        await _until(lambda: b.limiter.others_in_flight(TENANT) == 0, 5)
        assert time.monotonic() - released_at < b.limiter.remote_stale_s - 1.0
        assert not _refused(b)

        # Nothing escaped: the publish loops still run, the links reconnected once and re-provisioned.
        for replica in (a, b):
            task = replica.sync._task
            assert task is not None and not task.done(), task
            assert replica.link.reconnects == 1
            await _until(lambda r=replica: r.link._back_task is not None and r.link._back_task.done(), 20)
            assert replica.link._back_task.exception() is None
        assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]
    finally:
        await a.stop()
        await b.stop()
