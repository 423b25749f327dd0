"""The single NATS server SIGKILLed under load and restarted on the same port and data, after 1 s
and after 15 s. Nothing is restarted by hand: every service must notice, reconnect, re-provision
(the heartbeat bucket is memory-stored and lost with the restart) and carry on."""

from __future__ import annotations

import pytest

from tests.chaos.drills import run_drill

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]


@pytest.fixture(scope="module")
async def platform(platform_of):
    return await platform_of(1)


@pytest.mark.parametrize("outage_s", [1, 15])
async def test_broker_sigkill_and_restart_loses_nothing(platform, chaos_report, outage_s):
    report, logs = await run_drill(
        platform,
        f"broker SIGKILL, back after {outage_s}s",
        outage_s=outage_s,
        breaks=lambda _: platform.kill("nats"),
        repairs=lambda _: platform.restart_broker(),
        streamed=6,  # token batches are core NATS: lost with the broker, the text must still be whole
    )
    chaos_report.append(report)
    assert report.lost == 0 and report.answered_twice == 0 and report.wrong_adapter == 0, report
    # Every request was accepted before the outage and its deadline (90 s) outlasts it: all answered.
    assert report.correct == report.sent, report
    assert report.seconds_to_serve_again is not None and report.seconds_to_serve_again < outage_s + 30, report
    # One line per state change, not a traceback per poll.
    assert not logs.tracebacks, logs.tracebacks[:5]
    gateway = platform.gateway.gateway
    assert gateway.link.connected and gateway.link.reconnects >= 1
    assert not gateway.dispatcher.jobs


async def test_a_tenant_connects_and_is_answered_after_the_broker_restarts(platform):
    """The registry's auth callout reconnects and subscribes again on its own: a tenant's NATS credential,
    issued after the restarts above, connects and gets its answer through its own subjects."""
    from libs.client import LoraplexClient
    from libs.settings import ConnectionSettings

    reply = await platform.registry.client.post(f"/v1/tenants/{platform.tenant_a}/nats-credentials")
    assert reply.status_code == 201, reply.text
    url = ConnectionSettings.load(platform.stack.env_file).nats_url  # no operator credentials in it
    async with LoraplexClient(url, api_key=platform.key_a, nats_credential=reply.json()["credential"]) as lpx:
        rid = await lpx.submit("support", messages=[{"role": "user", "content": "Where is my order?"}], max_tokens=8)
        result = await lpx.result(rid, timeout=120)
    assert result.ok and result.adapter_digest_applied == platform.digest_a, result
