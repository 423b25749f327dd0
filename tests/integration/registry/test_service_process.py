"""The registry as its own process (`python -m services.registry`) on a free port, driven over HTTP
and through the `lpx` CLI, exactly as an operator would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from libs.stack import procs
from tests.integration.registry.conftest import ADMIN, ADMIN_TOKEN, create_database
from tests.registry_process import start_registry, stop_registry

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
async def registry_process(connections, tmp_path_factory):
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
        "LPX_REGISTRY_EVAL_DURABLE": f"proc-{uuid.uuid4().hex[:8]}",
        "LPX_REGISTRY_EVAL_DELIVER_POLICY": "new",
        "LPX_ENV_FILE": str(tmp_path_factory.mktemp("no-env") / "absent.env"),
    }
    log_path = tmp_path_factory.mktemp("registry-proc") / "registry.log"
    url, proc = start_registry(env, log_path)
    yield {"url": url, "env": env, "proc": proc, "log": log_path}
    # uvicorn re-raises the signal after a graceful shutdown, so -SIGTERM is a clean exit too.
    assert stop_registry(proc) in (0, -signal.SIGTERM), log_path.read_text()[-3000:]
    assert "registry stopped" in log_path.read_text()


def lpx(registry_process, *args: str) -> subprocess.CompletedProcess:
    env = {**registry_process["env"], "LPX_REGISTRY_URL": registry_process["url"], "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "libs.cli.main", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def test_http_api_and_openapi_docs(registry_process):
    url = registry_process["url"]
    spec = httpx.get(f"{url}/openapi.json").json()
    for path in ("/v1/adapters", "/v1/tenants", "/v1/resolve/{tenant}/{alias}", "/v1/base-models", "/healthz"):
        assert path in spec["paths"], path
    assert httpx.get(f"{url}/docs").status_code == 200
    assert httpx.get(f"{url}/v1/tenants").status_code == 401
    bases = httpx.get(f"{url}/v1/base-models", headers=ADMIN).json()
    assert {"smollm2-135m", "llama-3.1-8b"} <= {b["name"] for b in bases}  # seeded from the catalogue


def test_cli_tenant_base_and_adapter_flow(registry_process, adapter_dirs, base_model_path):
    created = lpx(registry_process, "tenant", "create", "cli-co")
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip().startswith("lpx_cli-co_") and "not shown again" in created.stderr
    again = lpx(registry_process, "tenant", "create", "cli-co")
    assert again.returncode == 1 and "already exists" in again.stderr

    # The catalogue's smollm2-135m and the same model registered from its config.json agree.
    base = lpx(registry_process, "base", "register", "smollm2-135m", str(base_model_path))
    assert base.returncode == 0 and "30 layers" in base.stdout, base.stderr
    other = lpx(registry_process, "base", "register", "smollm2-copy", str(base_model_path / "config.json"))
    assert other.returncode == 0, other.stderr

    pushed = lpx(
        registry_process, "adapter", "push", "cli-co/support", str(adapter_dirs["good"]), "--base", "smollm2-135m"
    )
    assert pushed.returncode == 0, pushed.stderr
    assert "registered cli-co/support-v1" in pushed.stdout and "pending" in pushed.stdout
    listed = lpx(registry_process, "adapter", "list", "cli-co")
    assert listed.returncode == 0 and "support" in listed.stdout
    shown = lpx(registry_process, "adapter", "show", "cli-co/support-v1")
    assert shown.returncode == 0 and '"status": "pending"' in shown.stdout

    not_explicit = lpx(
        registry_process, "adapter", "activate", "cli-co/support", "1", "--actor", "ops", "--reason", "manual"
    )
    assert not_explicit.returncode == 1 and "--override" in not_explicit.stderr
    activated = lpx(
        registry_process,
        "adapter",
        "activate",
        "cli-co/support",
        "1",
        "--override",
        "--actor",
        "ops",
        "--reason",
        "manual review",
    )
    assert activated.returncode == 0 and "active (override by ops)" in activated.stdout, activated.stderr
    history = lpx(registry_process, "adapter", "history", "cli-co/support")
    assert history.returncode == 0 and "v1" in history.stdout and "active" in history.stdout
    rollback = lpx(registry_process, "adapter", "rollback", "cli-co/support")
    assert rollback.returncode == 1 and "cannot roll back" in rollback.stderr


def test_cli_push_of_rank_64_is_refused_naming_the_limit(registry_process, adapter_dirs):
    lpx(registry_process, "tenant", "create", "rank-co")
    refused = lpx(
        registry_process, "adapter", "push", "rank-co/big", str(adapter_dirs["rank64"]), "--base", "smollm2-135m"
    )
    assert refused.returncode == 1
    assert "rank 64 exceeds this pool's limit of max_rank=16" in refused.stderr, refused.stderr
    assert "rank_too_high" in refused.stderr
    listed = httpx.get(f"{registry_process['url']}/v1/adapters", params={"tenant": "rank-co"}, headers=ADMIN).json()
    assert listed == []
