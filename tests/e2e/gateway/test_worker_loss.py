"""SIGKILL one of two workers under load: its heartbeat expires, the gateway re-routes its unfinished
requests to the live worker, and every accepted request is answered exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys

import httpx
import pytest

from tests.e2e.gateway.conftest import BASE, POOL
from tests.e2e.worker.test_worker_drain import _wait_for_heartbeat

pytestmark = pytest.mark.e2e


async def test_sigkill_one_worker_every_request_completes_once(
    stack, base_model_path, gateway, tenants, make_worker, client, tmp_path
):
    env = {
        **os.environ,
        "LPX_ENV_FILE": str(stack.env_file),
        "LPX_WORKER_WORKER_ID": "gw-kill",
        "LPX_WORKER_POOL": POOL,
        "LPX_WORKER_BASE_MODEL": BASE,
        "LPX_WORKER_MODEL_PATH": str(base_model_path),
        "LPX_WORKER_MAX_LORAS": "2",
        "LPX_WORKER_MAX_CPU_LORAS": "2",
        "LPX_WORKER_CAPACITY": "4",
        "LPX_WORKER_HEARTBEAT_INTERVAL_S": "0.5",
        "LPX_WORKER_HEARTBEAT_TTL_S": "3",
        "LPX_WORKER_DISK_CACHE_DIR": str(tmp_path / "cache-gw-kill"),
        "LPX_WORKER_LOG_FORMAT": "json",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    log = open(tmp_path / "gw-kill.log", "w")
    # Its own process group: SIGKILL takes the worker and its vLLM engine processes down together, as a
    # crashed host would (killing only the parent would leave the engine core orphaned and busy).
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.worker"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    gw = gateway.gateway
    try:
        await _wait_for_heartbeat(client.js, "gw-kill", proc)
        await make_worker("gw-peer")
        await gateway.wait_workers(2)
        rerouted_before = gw.rerouter.rerouted
        models = ["support", BASE]
        async with httpx.AsyncClient(
            base_url=gateway.url, timeout=300, headers={"Authorization": f"Bearer {tenants.key_a}"}
        ) as http:

            async def ask(i: int) -> httpx.Response:
                return await http.post(
                    "/v1/chat/completions",
                    json={
                        "model": models[i % 2],
                        # Long enough to be mid-generation at the kill on an idle machine too (with 32
                        # tokens the killed worker had answered everything before it died: nothing stranded).
                        "max_tokens": 96,
                        "messages": [{"role": "user", "content": f"Question number {i}: where is my order?"}],
                    },
                )

            calls = [asyncio.create_task(ask(i)) for i in range(8)]
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 120
            while gw.dispatcher.loads.get("gw-kill", 0) < 1 and loop.time() < deadline:
                await asyncio.sleep(0.1)
            assert gw.dispatcher.loads.get("gw-kill", 0) >= 1, "nothing was routed to the worker to be killed"
            await asyncio.sleep(0.5)  # let it start generating
            stranded = gw.dispatcher.loads.get("gw-kill", 0)
            os.killpg(proc.pid, signal.SIGKILL)
            replies = await asyncio.gather(*calls)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        log.close()
    assert all(r.status_code == 200 for r in replies), [(r.status_code, r.text[:200]) for r in replies]
    rids = [r.headers["x-request-id"] for r in replies]
    assert len(set(rids)) == 8
    by_worker = {}
    for r in replies:
        by_worker.setdefault(r.headers["x-lpx-worker"], []).append(r)
    assert stranded >= 1 and gw.rerouter.rerouted - rerouted_before >= 1, (stranded, gw.rerouter.rerouted)
    assert "gw-peer" in by_worker
    for i, r in enumerate(replies):
        if models[i % 2] == "support":
            assert "Ahoy" in r.json()["choices"][0]["message"]["content"]
    # Each call got exactly one answer (a later result for an answered id is dropped, never sent), and
    # nothing is left waiting.
    assert not gw.dispatcher.jobs
