"""SIGTERM on a real worker process mid-load: it stops pulling, finishes what it started, and hands
the rest to its pool, so every accepted request is answered once, by it or by another worker."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest

from libs.contracts import WorkerHeartbeat, subjects
from tests.e2e.worker.conftest import BASE, POOL

pytestmark = pytest.mark.e2e


async def _wait_for_heartbeat(js, worker_id: str, proc: subprocess.Popen, timeout: float = 180) -> WorkerHeartbeat:
    kv = None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        assert proc.poll() is None, f"worker exited early with {proc.returncode}"
        try:
            kv = kv or await js.key_value(subjects.HEARTBEAT_BUCKET)
            return WorkerHeartbeat.model_validate_json((await kv.get(worker_id)).value)
        except Exception:
            await asyncio.sleep(1.0)
    raise AssertionError(f"worker {worker_id} never sent a heartbeat")


async def test_sigterm_mid_load_every_request_answered_once(
    stack, base_model_path, make_worker, client, tones, tmp_path
):
    env = {
        **os.environ,
        "LPX_ENV_FILE": str(stack.env_file),
        "LPX_WORKER_WORKER_ID": "w-term",
        "LPX_WORKER_POOL": POOL,
        "LPX_WORKER_BASE_MODEL": BASE,
        "LPX_WORKER_MODEL_PATH": str(base_model_path),
        "LPX_WORKER_MAX_LORAS": "2",
        "LPX_WORKER_MAX_CPU_LORAS": "2",
        "LPX_WORKER_CAPACITY": "2",
        "LPX_WORKER_DISK_CACHE_DIR": str(tmp_path / "cache-w-term"),
        "LPX_WORKER_LOG_FORMAT": "json",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    log = open(tmp_path / "w-term.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "services.worker"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        await _wait_for_heartbeat(client.js, "w-term", proc)
        await make_worker("w-peer")  # another worker of the same pool, in this process
        adapters = [tones["pirate"], tones["formal"], None]
        rids = [
            await client.send("w-term", adapters[i % 3], f"Question number {i}: where is my order?", max_tokens=32)
            for i in range(8)
        ]
        # Wait until the process is generating (its first results or in-flight work), then SIGTERM it.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 120
        while not any(r in client.results for r in rids) and loop.time() < deadline:
            await asyncio.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        results = await client.wait(rids, timeout=300)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    by_worker = {}
    for rid in rids:
        assert len(client.results[rid]) == 1, f"{rid} answered {len(client.results[rid])} times"
        assert results[rid].ok, results[rid].error
        by_worker.setdefault(results[rid].worker_id, []).append(rid)
    assert set(by_worker) == {"w-term", "w-peer"}, by_worker  # some finished before the drain, the rest handed off
    for i, rid in enumerate(rids):
        if adapters[i % 3] is tones["pirate"]:
            assert "Ahoy" in results[rid].text
    # The drained worker left the pool at once (no waiting for the heartbeat TTL).
    kv = await client.js.key_value(subjects.HEARTBEAT_BUCKET)
    with pytest.raises(Exception):  # noqa: B017
        await kv.get("w-term")
