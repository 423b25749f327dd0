"""What the broker drills do for NATS, for the platform's other dependencies, under the same load:
PostgreSQL SIGKILLed while adapters are being pushed, the S3 store stopped while adapters are loaded
cold, and a worker process SIGKILLed while it generates."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from libs.routing import BoundedLoadRouter
from tests.chaos.conftest import BASE, POOL, _activate
from tests.chaos.drills import run_drill

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]


@pytest.fixture(scope="module")
async def platform(platform_of):
    return await platform_of(1)


@pytest.fixture(scope="module")
def noise(base_model_path):
    from tests.adapters import noise_adapters

    return noise_adapters(base_model_path, 4)


async def _push_until_stored(registry, tenant: str, adapter: str, path, timeout_s: float = 90.0) -> list[int]:
    """What a client does with an idempotent push: retry while the registry answers 503."""
    statuses = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            reply = await registry.push(tenant, adapter, path)
            statuses.append(reply.status_code)
            if reply.status_code != 503:
                return statuses
        except Exception as exc:  # noqa: BLE001 - the transport failing mid-kill: retry like a client would
            statuses.append(type(exc).__name__)
        await asyncio.sleep(0.5)
    return statuses


async def test_postgres_sigkill_during_pushes(platform, chaos_report, noise):
    tenant_a = platform.tenant_a
    pushes: list[asyncio.Task] = []

    async def kill_during_pushes(_load) -> None:
        for i, path in enumerate(noise):
            pushes.append(asyncio.create_task(_push_until_stored(platform.registry, tenant_a, f"pg-{i}", path)))
        await asyncio.sleep(0.2)
        await platform.kill("postgres")

    async def restart(_load) -> None:
        await platform.restart_broker()  # `stack up` starts whatever is down: here PostgreSQL

    report, logs = await run_drill(platform, "PostgreSQL SIGKILL during 4 pushes, back after 2s",
                                   breaks=kill_during_pushes, outage_s=2, repairs=restart)  # fmt: skip
    outcomes = await asyncio.gather(*pushes)
    report.notes += f"; pushes (status per try): {outcomes}"
    chaos_report.append(report)
    assert all(o[-1] in (200, 201) for o in outcomes), outcomes
    assert not any(s == 500 for o in outcomes for s in o), outcomes
    assert report.lost == 0 and report.answered_twice == 0 and report.wrong_adapter == 0, report
    assert report.correct == report.sent, report  # serving does not need PostgreSQL for cached aliases


async def test_s3_stopped_during_cold_adapter_loads(platform, chaos_report, noise):
    tenant_b = platform.tenant_b
    cold = [f"cold-{uuid.uuid4().hex[:4]}-{i}" for i in range(2)]
    for name, path in zip(cold, noise[:2], strict=True):
        await _activate(platform.registry, tenant_b, name, path)  # stored in S3, on no worker yet

    async def stop_s3_then_ask_cold(load) -> None:
        await platform.kill("s3")
        for i, name in enumerate(cold):
            load.add_sync(name, platform.key_b, 100 + i)  # cold: must come from the store, which is down

    async def restart_then_ask_again(load) -> None:
        await platform.restart_broker()  # `stack up`: here the S3 store
        for i, name in enumerate(cold):
            load.add_sync(name, platform.key_b, 200 + i)

    name = "S3 stopped during cold adapter loads, back after 3s"
    report, logs = await run_drill(platform, name, breaks=stop_s3_then_ask_cold, outage_s=3,
                                   repairs=restart_then_ask_again)  # fmt: skip
    chaos_report.append(report)
    assert report.lost == 0 and report.answered_twice == 0 and report.wrong_adapter == 0, report
    # The cold loads during the outage fail closed with a clear 503; everything else, and the same
    # adapters once the store is back, is served.
    assert set(report.errors) <= {"503 adapter_unavailable"}, report.errors
    assert report.correct + sum(report.errors.values()) == report.sent, report
    assert report.correct >= report.sent - len(cold), report


def _doomed_worker_id(digest: str, peers: tuple[str, ...]) -> str:
    """A worker id that the gateway's router sends tenant A's adapter to, so that the worker killed in
    the drill is certainly generating when it dies."""
    for i in range(200):
        candidate = f"chaos-doomed-{i}"
        workers = tuple(sorted((*peers, candidate)))
        if BoundedLoadRouter(workers=workers).primary(digest) == candidate:
            return candidate
    raise AssertionError("no worker id routes the adapter to itself")


async def test_worker_sigkill_under_load(platform, chaos_report, base_model_path, tmp_path):
    gw = platform.gateway.gateway
    peers = tuple(w.worker_id for w in platform.workers)
    doomed = _doomed_worker_id(platform.digest_a, peers)
    env = {**os.environ, "LPX_ENV_FILE": str(platform.stack.env_file), "LPX_WORKER_WORKER_ID": doomed,
           "LPX_WORKER_POOL": POOL, "LPX_WORKER_BASE_MODEL": BASE, "LPX_WORKER_MODEL_PATH": str(base_model_path),
           "LPX_WORKER_MAX_LORAS": "2", "LPX_WORKER_MAX_CPU_LORAS": "2", "LPX_WORKER_CAPACITY": "8",
           "LPX_WORKER_HEARTBEAT_INTERVAL_S": "0.5", "LPX_WORKER_HEARTBEAT_TTL_S": "3",
           "LPX_WORKER_DISK_CACHE_DIR": str(tmp_path / "cache"), "LPX_WORKER_LOG_FORMAT": "json",
           "VLLM_CPU_KVCACHE_SPACE": "1"}  # fmt: skip
    with open(tmp_path / "doomed.log", "w") as log:
        # Its own process group: SIGKILL takes the worker and its vLLM engine processes down together.
        proc = subprocess.Popen([sys.executable, "-m", "services.worker"], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    stranded: list[int] = []
    try:
        await platform.gateway.wait_workers(3, timeout=240)

        async def kill_worker(_load) -> None:
            deadline = time.monotonic() + 60
            while gw.dispatcher.loads.get(doomed, 0) < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # let it start generating
            stranded.append(gw.dispatcher.loads.get(doomed, 0))
            os.killpg(proc.pid, signal.SIGKILL)

        report, logs = await run_drill(platform, "worker SIGKILL while generating", breaks=kill_worker)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    report.notes += f"; {stranded[0] if stranded else 0} requests on the killed worker, re-routed"
    chaos_report.append(report)
    assert stranded and stranded[0] >= 1, "nothing was routed to the worker that was killed"
    assert report.lost == 0 and report.answered_twice == 0 and report.wrong_adapter == 0, report
    assert report.correct == report.sent, report
    await platform.gateway.wait_workers(2)
