"""`lpx top` and `lpx adapter where` as an operator runs them, against REAL servers: the session stack
(NATS, PostgreSQL, S3), the registry as its own process, a gateway process and two workers on the
simulated engine (`python -m services.worker`, LPX_WORKER_ENGINE=sim), and the `lpx` CLI as a subprocess."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from libs.fleet import Fleet, FleetSpec
from libs.stack import procs
from tests.integration.registry.conftest import ADMIN, ADMIN_TOKEN, create_database
from tests.registry_process import start_registry, stop_registry

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
WORKERS = ("top-sim-0", "top-sim-1")


@pytest.fixture(scope="module")
async def registry_url(connections, tmp_path_factory):
    """The registry as a process on a free port: `lpx adapter where` asks it over HTTP, as in production."""
    port = procs.free_port()
    env = {
        **os.environ,
        "LPX_NATS_URL": connections.nats_url,
        "LPX_PG_DSN": await create_database(connections),
        "LPX_S3_ENDPOINT": connections.s3_endpoint,
        "LPX_S3_ACCESS_KEY": connections.s3_access_key,
        "LPX_S3_SECRET_KEY": connections.s3_secret_key,
        "LPX_S3_BUCKET": connections.s3_bucket,
        "LPX_REGISTRY_PORT": str(port),
        "LPX_REGISTRY_ADMIN_TOKEN": ADMIN_TOKEN,
        "LPX_REGISTRY_EVAL_DURABLE": f"top-{uuid.uuid4().hex[:8]}",
        "LPX_REGISTRY_EVAL_DELIVER_POLICY": "new",
        "LPX_ENV_FILE": str(tmp_path_factory.mktemp("no-env") / "absent.env"),
    }
    url, proc = start_registry(env, tmp_path_factory.mktemp("top-registry") / "registry.log")
    yield url
    stop_registry(proc)


@pytest.fixture(scope="module")
def adapter_files(base_model_path) -> Path:
    from tests.adapters import tiny_adapters

    return tiny_adapters(base_model_path, 1)[0]


@pytest.fixture(scope="module")
def tenant(registry_url, adapter_files) -> dict:
    """A tenant with one adapter, `support`, pushed and activated (admin override: no eval gate here)."""
    name = f"top-{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=registry_url, headers=ADMIN, timeout=60) as http:
        created = http.post("/v1/tenants", json={"name": name})
        assert created.status_code == 201, created.text
        files = [("files", (p.name, p.read_bytes())) for p in sorted(adapter_files.iterdir()) if p.is_file()]
        pushed = http.post(
            "/v1/adapters", data={"tenant": name, "adapter": "support", "base_model": "smollm2-135m"}, files=files
        )
        assert pushed.status_code == 201, pushed.text
        version = pushed.json()["version"]
        activated = http.post(
            f"/v1/tenants/{name}/adapters/support/versions/{version['number']}/activate",
            json={"actor": "top-test", "reason": "lpx top integration test"},
        )
        assert activated.status_code == 200, activated.text
    return {"name": name, "key": created.json()["api_key"], "digest": version["digest"]}


@pytest.fixture(scope="module")
def gateway_metrics_port() -> int:
    return procs.free_port()


@pytest.fixture(scope="module")
async def fleet(stack, tmp_path_factory, gateway_metrics_port):
    spec = FleetSpec(pool=f"top-{uuid.uuid4().hex[:6]}", capacity=4, decode_tok_s=400.0, heartbeat_interval_s=0.5)
    made = Fleet(env_file=stack.env_file, state=tmp_path_factory.mktemp("top-fleet"), spec=spec)
    metrics = {"LPX_GATEWAY_METRICS_PORT": str(gateway_metrics_port), "LPX_GATEWAY_METRICS_HOST": "127.0.0.1"}
    made.start_gateway("top-gw", metrics)
    for worker in WORKERS:
        made.start_worker(worker)
    try:
        await made.wait_ready(len(WORKERS))
        yield made
    finally:
        made.stop()


def lpx(env: dict, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "libs.cli.main", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def cli_env(stack, registry_url: str) -> dict:
    return {
        **os.environ,
        "LPX_ENV_FILE": str(stack.env_file),
        "LPX_REGISTRY_URL": registry_url,
        "LPX_REGISTRY_ADMIN_TOKEN": ADMIN_TOKEN,
        "COLUMNS": "150",
    }


def live_top(env: dict, seconds: float) -> tuple[int, str]:
    """`lpx top` on a terminal (a pty) for `seconds`, then `q`: its exit status and what it drew."""
    master, terminal = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "libs.cli.main", "top"],
        cwd=REPO,
        env={**env, "LINES": "60"},
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    drawn = bytearray()

    def read_for(duration: float) -> None:
        deadline = time.monotonic() + duration
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.1)[0]:
                try:
                    drawn.extend(os.read(master, 65536))
                except OSError:  # the process closed the terminal
                    return

    read_for(seconds)
    os.write(master, b"q")
    read_for(5 if proc.poll() is None else 0.5)
    try:
        status = proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return status, drawn.decode(errors="replace")


def chat(gateway: str, key: str, count: int | None = None, until: threading.Event | None = None) -> list[str]:
    """Chat completions on the tenant's adapter, `count` of them or until `until` is set; the workers
    that answered."""
    served = []
    with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {key}"}) as http:
        while (count is None or len(served) < count) and not (until and until.is_set()):
            body = {"model": "support", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
            reply = http.post(f"{gateway}/v1/chat/completions", json=body)
            assert reply.status_code == 200, reply.text
            served.append(reply.headers["X-Lpx-Worker"])
            time.sleep(0.05)
    return served


async def test_top_and_adapter_where_on_a_live_fleet(
    stack, fleet, tenant, registry_url, gateway_metrics_port, tmp_path
):
    env, (_, gateway) = cli_env(stack, registry_url), fleet.gateways["top-gw"]
    metrics_url = f"http://127.0.0.1:{gateway_metrics_port}/metrics"
    chat(gateway, tenant["key"], 2)

    # Snapshots taken while the tenant keeps asking: their two samples see the gateway's limit reports
    # and the workers' counters move.
    done = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        traffic = pool.submit(chat, gateway, tenant["key"], until=done)
        try:
            top = lpx(env, "top", "--once", "--json", "--window", "3", "--metrics", metrics_url)
            frame = lpx(env, "top", "--once", "--window", "2")  # as a person sees it
        finally:
            done.set()
        served = traffic.result(timeout=60)
    assert top.returncode == 0, top.stderr
    snap = json.loads(top.stdout)
    serving = served[-1]  # the adapter is in this worker's gpu slots now
    workers = {w["worker_id"]: w for w in snap["workers"]}
    assert set(WORKERS) <= set(workers)
    for worker in WORKERS:
        assert workers[worker]["pool"] == fleet.spec.pool
        assert workers[worker]["capacity"] == 4 and workers[worker]["max_loras"] == fleet.spec.max_loras
    assert workers[serving]["gpu_adapters"] == 1 and workers[serving]["tier_hits"]["gpu"] >= 1
    assert workers[serving]["generated_tokens"] > 0 and workers[serving]["tok_s"] > 0
    hot = next(a for a in snap["adapters"] if a["digest"] == tenant["digest"])
    assert hot["requests"] >= 2 and hot["req_s"] > 0
    assert hot["name"] == f"{tenant['name']}/support v1"  # named by the registry
    assert any(p["worker_id"] == serving and p["tier"] == "gpu" for p in hot["placements"])
    assert "top-gw" in snap["gateways"]
    row = next(t for t in snap["tenants"] if t["tenant"] == tenant["name"])
    assert row["req_s"] > 0 and row["by_status"]["200"] > 0  # from the limit reports, and the gateway's metrics
    assert any(s["stream"] == "LPX_INFER" for s in snap["streams"])
    assert frame.returncode == 0, frame.stderr
    for shown in (serving, fleet.spec.pool, f"{tenant['name']}/support v1", "LPX_INFER"):
        assert shown in frame.stdout, (shown, frame.stdout)
    (tmp_path / "lpx_top_frame.txt").write_text(frame.stdout)  # kept for the README

    where = lpx(env, "adapter", "where", f"{tenant['name']}/support", "--json")
    assert where.returncode == 0, where.stderr
    answer = json.loads(where.stdout)
    assert answer["digest"] == tenant["digest"] and answer["version"] == 1
    held = {p["worker_id"]: p for p in answer["workers"]}
    assert held[serving]["tier"] == "gpu" and held[serving]["pool"] == fleet.spec.pool
    assert time.time() - 120 < held[serving]["since"] <= time.time()
    # one worker of the one pool owns it on the ring: the one the gateway routed every request to
    assert answer["placed_on"] == {fleet.spec.pool: serving}
    assert answer["kept_on"][fleet.spec.pool][0] == serving  # then the next of its ring order, if any
    table = lpx(env, "adapter", "where", f"{tenant['name']}/support")
    assert table.returncode == 0 and serving in table.stdout and "gpu" in table.stdout, table.stderr

    # The registry away: the view goes on with digests and says why.
    dead = f"http://127.0.0.1:{procs.free_port()}"
    nameless = lpx({**env, "LPX_REGISTRY_URL": dead}, "top", "--once", "--json", "--window", "0.5")
    assert nameless.returncode == 0, nameless.stderr
    snap = json.loads(nameless.stdout)
    assert next(a for a in snap["adapters"] if a["digest"] == tenant["digest"])["name"] is None
    assert f"adapter names: registry at {dead} unreachable (connection refused) (digests shown)" in snap["notes"]

    # The live view on a terminal: frames every second until `q`.
    status, drawn = live_top(env, 3.0)
    assert status == 0, drawn[-2000:]
    assert serving in drawn and "q quits" in drawn


def test_top_with_nats_down_says_so_in_one_line():
    dead = f"nats://127.0.0.1:{procs.free_port()}"
    result = lpx({**os.environ, "LPX_NATS_URL": dead}, "top", "--once", timeout_s=30)
    assert result.returncode == 1
    assert result.stderr == f"lpx top: cannot reach NATS at {dead} (connection refused)\n"
    assert result.stdout == ""
