"""Trainer end-to-end harness, all REAL: the session stack, the registry as its own process (the
trainer pushes over its HTTP API), the eval gate in-process on the session's vLLM engine, trainers as
subprocesses (so a test can SIGKILL one), and the `lpx` CLI as a subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from libs.stack import procs
from tests.e2e.eval_gate.conftest import gate_settings, tone_dataset
from tests.e2e.worker.conftest import store, tones  # noqa: F401
from tests.integration.registry.conftest import ADMIN, ADMIN_TOKEN, create_database
from tests.registry_process import start_registry, stop_registry

REPO = Path(__file__).resolve().parents[3]
BASE = "smollm2-135m"

__all__ = ["tone_dataset"]


class RegistryProcess:
    def __init__(self, url: str, env: dict, proc: subprocess.Popen, log: Path) -> None:
        self.url, self.env, self.proc, self.log = url, env, proc, log
        self.client = httpx.AsyncClient(base_url=url, headers=ADMIN, timeout=60)
        self.keys: dict[str, str] = {}  # tenant -> API key

    async def lpx(self, *args: str, timeout_s: float = 600) -> tuple[int, str]:
        """The CLI as an operator runs it; returns (exit status, stdout + stderr)."""
        env = {**self.env, "LPX_REGISTRY_URL": self.url, "COLUMNS": "200"}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "libs.cli.main",
            *args,
            cwd=REPO,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
        return proc.returncode, output.decode(errors="replace")

    async def new_tenant(self, prefix: str, lines: list[dict] | None) -> str:
        import json

        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        created = await self.client.post("/v1/tenants", json={"name": name})
        assert created.status_code == 201, created.text
        self.keys[name] = created.json()["api_key"]
        if lines is not None:
            body = "".join(json.dumps(line) + "\n" for line in lines).encode()
            reply = await self.client.post(
                "/v1/datasets",
                data={"tenant": name, "name": "support-data"},
                files={"file": ("support-data.jsonl", body)},
            )
            assert reply.status_code == 201, reply.text
        return name

    async def version(self, tenant: str, alias: str) -> dict:
        return (await self.client.get(f"/v1/tenants/{tenant}/aliases/{alias}")).json()


@pytest.fixture(scope="module")
async def registry_proc(connections, stack, tmp_path_factory):
    # Module-scoped: every registry answers the same NATS queue group, so only one may run at a time.
    port = procs.free_port()
    env = {
        **os.environ,
        "LPX_ENV_FILE": str(stack.env_file),
        "LPX_PG_DSN": await create_database(connections),
        "LPX_REGISTRY_PORT": str(port),
        "LPX_REGISTRY_ADMIN_TOKEN": ADMIN_TOKEN,
        "LPX_REGISTRY_EVAL_DURABLE": f"train-{uuid.uuid4().hex[:8]}",
        "LPX_REGISTRY_EVAL_DELIVER_POLICY": "new",
        "LPX_REGISTRY_OUTBOX_POLL_S": "0.2",
    }
    log = tmp_path_factory.mktemp("registry") / "registry.log"
    url, proc = start_registry(env, log)
    running = RegistryProcess(url, env, proc, log)
    yield running
    await running.client.aclose()
    stop_registry(proc)


@pytest.fixture(scope="module")
async def gate_a(connections, engine, base_model_path, tmp_path_factory, registry_proc):
    """The eval gate of the default base, in-process on the session engine."""
    from services.eval_gate.app import EvalGate

    settings = gate_settings(connections, model_path=base_model_path, work_dir=tmp_path_factory.mktemp("gate-a"))
    gate = EvalGate(settings, engine=engine)
    await gate.start()
    yield gate
    await gate.stop()
    await gate.close()


class TrainerProcess:
    """`python -m services.trainer` in its own process group (SIGKILL takes it down whole)."""

    def __init__(self, registry: RegistryProcess, trainer_id: str, log: Path, **env: str) -> None:
        self.env = {
            **registry.env,
            "LPX_TRAINER_TRAINER_ID": trainer_id,
            "LPX_TRAINER_REGISTRY_URL": registry.url,
            "LPX_TRAINER_ADMIN_TOKEN": ADMIN_TOKEN,
            **env,
        }
        self.log = log
        self._out = open(log, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services.trainer"],
            cwd=REPO,
            env=self.env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    async def wait_ready(self, timeout_s: float = 120) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if "ready" in self.log.read_text(errors="replace"):
                return
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            await asyncio.sleep(0.3)
        raise AssertionError("the trainer did not start")

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self._out.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()
        self._out.close()


async def wait_for(check, timeout_s: float, interval_s: float = 0.5, what: str = "condition"):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
