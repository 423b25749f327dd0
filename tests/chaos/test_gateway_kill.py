"""A gateway SIGKILLed with async submissions in flight: a second gateway process takes every async
submission, is killed while it waits for the workers, and the platform's other gateway (its
submission consumer started again, as a replacement replica would be) finishes them after the
consumer's ack wait. Every result is retrievable, none is generated into two stored results."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from libs.contracts import subjects
from tests.chaos.drills import run_drill
from tests.e2e.gateway.conftest import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]


@pytest.fixture(scope="module")
async def platform(platform_of):
    return await platform_of(1)


def _start_gateway(platform, port: int, log_path) -> subprocess.Popen:
    env = {
        **os.environ,
        "LPX_ENV_FILE": str(platform.stack.env_file),
        "LPX_GATEWAY_PORT": str(port),
        "LPX_GATEWAY_HOST": "127.0.0.1",
        "LPX_GATEWAY_HEARTBEAT_STALENESS_S": "3",
        "LPX_GATEWAY_LOG_FORMAT": "json",
    }
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "services.gateway"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def _ready(url: str, proc: subprocess.Popen, workers: int = 2, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:
        while True:
            assert proc.poll() is None, "the second gateway exited during start-up"
            with contextlib.suppress(httpx.HTTPError):
                reply = await http.get("/readyz")
                if reply.status_code == 200 and reply.json()["workers"] == workers:
                    return
            assert time.monotonic() < deadline, "the second gateway did not become ready"
            await asyncio.sleep(0.25)


async def test_gateway_sigkill_with_async_submissions_in_flight(platform, chaos_report, tmp_path):
    gw = platform.gateway.gateway
    port = free_port()
    nc, js = await platform.jetstream()
    held: list[int] = []
    proc = _start_gateway(platform, port, tmp_path / "gateway-b.log")
    try:
        await _ready(f"http://127.0.0.1:{port}", proc)
        await platform.on_gateway(gw.submissions.stop)  # the second gateway takes every async submission

        async def kill_gateway_b(_load) -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # until it holds every submission of the load
                info = await js.consumer_info(subjects.SUBMIT_STREAM, gw.settings.submit_durable)
                held.append(info.num_ack_pending)
                if info.num_ack_pending >= 6:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # dispatched to the workers, generating
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            await platform.on_gateway(gw.submissions.start)  # the replacement replica

        report, logs = await run_drill(
            platform, "gateway SIGKILL with async submissions in flight", breaks=kill_gateway_b
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        await nc.close()
    report.notes += "; async submissions finished by the other gateway after the consumer's ack wait (30 s)"
    chaos_report.append(report)
    assert held and held[-1] >= 6, f"the killed gateway never held the submissions: {held[-5:]}"
    assert report.lost == 0 and report.answered_twice == 0 and report.wrong_adapter == 0, report
    assert report.correct == report.sent, report
    assert not logs.tracebacks, logs.tracebacks[:5]
