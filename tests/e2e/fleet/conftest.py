"""Fleet harness, all REAL but the engine: the session stack (NATS, PostgreSQL, S3), the registry
in-process with tenants and many small adapters pushed through it and activated, N gateway processes
(`python -m services.gateway`) and M simulated workers as processes (`python -m services.worker` with
LPX_WORKER_ENGINE=sim: the real worker code on the simulated engine), so processes can be SIGKILLed."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.e2e.gateway.conftest import BASE, free_port, gateway_postgres, gateway_registry  # noqa: F401

POOL = "fleet-smollm2-r16"


@dataclass
class Fleet:
    env_file: Path
    state: Path
    gateways: dict[str, tuple[subprocess.Popen, str]] = field(default_factory=dict)  # id -> (process, url)
    workers: dict[str, subprocess.Popen] = field(default_factory=dict)

    def _spawn(self, module: str, env: dict, log_name: str) -> subprocess.Popen:
        log = open(self.state / f"{log_name}.log", "ab")  # noqa: SIM115 - the child owns it from here
        full = {**os.environ, "LPX_ENV_FILE": str(self.env_file), **env}
        return subprocess.Popen([sys.executable, "-m", module], env=full, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip

    def start_gateway(self, gateway_id: str) -> str:
        port = free_port()
        env = {"LPX_GATEWAY_PORT": str(port), "LPX_GATEWAY_HOST": "127.0.0.1", "LPX_GATEWAY_GATEWAY_ID": gateway_id,
               "LPX_GATEWAY_HEARTBEAT_STALENESS_S": "3", "LPX_GATEWAY_POOL_POLL_S": "0.25",
               "LPX_GATEWAY_DRAIN_GRACE_S": "5", "LPX_GATEWAY_BASE_MODELS": f'["{BASE}"]',
               "LPX_GATEWAY_LOG_LEVEL": "WARNING"}  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        self.gateways[gateway_id] = (self._spawn("services.gateway", env, gateway_id), url)
        return url

    def start_worker(self, worker_id: str, decode_tok_s: float = 200.0) -> None:
        env = {"LPX_WORKER_WORKER_ID": worker_id, "LPX_WORKER_POOL": POOL, "LPX_WORKER_BASE_MODEL": BASE,
               "LPX_WORKER_ENGINE": "sim", "LPX_WORKER_SIM_DECODE_TOK_S": str(decode_tok_s),
               "LPX_WORKER_MODEL_PATH": str(self.state), "LPX_WORKER_MAX_LORAS": "4",
               "LPX_WORKER_MAX_CPU_LORAS": "16", "LPX_WORKER_CAPACITY": "16",
               "LPX_WORKER_DISK_CACHE_DIR": str(self.state / f"cache-{worker_id}"),
               "LPX_WORKER_HEARTBEAT_INTERVAL_S": "0.5", "LPX_WORKER_HEARTBEAT_TTL_S": "3",
               "LPX_WORKER_LOG_LEVEL": "WARNING"}  # fmt: skip
        self.workers[worker_id] = self._spawn("services.worker", env, worker_id)

    def kill(self, proc: subprocess.Popen) -> None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    async def wait_ready(self, workers: int, timeout_s: float = 120) -> None:
        """Every gateway ready and seeing `workers` live workers."""
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=5) as http:
            for gateway_id, (proc, url) in self.gateways.items():
                while True:
                    assert proc.poll() is None, f"{gateway_id} exited: {self.log_tail(gateway_id)}"
                    try:
                        if (await http.get(f"{url}/readyz")).json().get("workers") == workers:
                            break
                    except (httpx.HTTPError, ValueError):
                        pass
                    assert time.monotonic() < deadline, f"{gateway_id} never saw {workers} workers"
                    await asyncio.sleep(0.25)

    def log_tail(self, name: str, lines: int = 20) -> str:
        path = self.state / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        procs = [p for p, _ in self.gateways.values()] + list(self.workers.values())
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


@dataclass
class FleetTenants:
    key: str
    tenant: str
    aliases: dict[str, str]  # alias -> digest of its active version


async def push_many(registry, tenant: str, paths: list[Path], concurrency: int = 4) -> dict[str, str]:
    """Push and activate every adapter (admin override: the eval gate is not under test here)."""
    slots = asyncio.Semaphore(concurrency)

    async def one(i: int, path: Path) -> tuple[str, str]:
        alias = f"a{i:03d}"
        async with slots:
            reply = await registry.push(tenant, alias, path)
            assert reply.status_code == 201, reply.text
            version = reply.json()["version"]
            url = f"/v1/tenants/{tenant}/adapters/{alias}/versions/{version['number']}/activate"
            done = await registry.client.post(url, json={"actor": "fleet-test", "reason": "fleet fixture"})
            assert done.status_code == 200, done.text
        return alias, version["digest"]

    return dict(await asyncio.gather(*(one(i, p) for i, p in enumerate(paths))))


@pytest.fixture(scope="package")
async def fleet_tenant(gateway_registry, base_model_path) -> FleetTenants:  # noqa: F811
    from tests.adapters import tiny_adapters

    paths = await asyncio.to_thread(tiny_adapters, base_model_path, 100)
    tenant = f"fleet-{uuid.uuid4().hex[:6]}"
    key = await gateway_registry.create_tenant(tenant)
    return FleetTenants(key, tenant, await push_many(gateway_registry, tenant, paths))


@pytest.fixture
def fleet(stack, tmp_path):
    made = Fleet(env_file=stack.env_file, state=tmp_path)
    yield made
    made.stop()
