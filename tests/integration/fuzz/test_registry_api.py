"""The registry's admin API fuzzed from its own OpenAPI (schemathesis) on the real stack: a registry
process on a fresh database (PostgreSQL, NATS, S3 of the session stack), admin credentials, every
operation (then again with a registry credential of each scope: admin, a tenant's maintainer). No input
may give a server error, every status and body must be the documented ones."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import httpx
import pytest

from libs.stack.procs import free_port
from tests.fuzz import FIXED_SEED, fuzz, seeds
from tests.integration.registry.conftest import ADMIN_TOKEN, create_database

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def registry_url(stack, connections, tmp_path_factory):
    dsn = await create_database(connections)
    port = free_port()
    log = tmp_path_factory.mktemp("fuzz-registry") / "registry.log"
    durable = uuid.uuid4().hex[:8]
    env = {
        **os.environ,
        "LPX_ENV_FILE": str(stack.env_file),
        "LPX_PG_DSN": dsn,
        "LPX_REGISTRY_HOST": "127.0.0.1",
        "LPX_REGISTRY_PORT": str(port),
        "LPX_REGISTRY_ADMIN_TOKEN": ADMIN_TOKEN,
        "LPX_REGISTRY_USAGE_DURABLE": f"fuzz-usage-{durable}",
        "LPX_REGISTRY_USAGE_DELIVER_POLICY": "new",
        "LPX_REGISTRY_EVAL_DURABLE": f"fuzz-eval-{durable}",
        "LPX_REGISTRY_EVAL_DELIVER_POLICY": "new",
        "LPX_REGISTRY_LOG_LEVEL": "WARNING",
    }
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.registry"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the registry did not become ready"
            time.sleep(0.3)
        # Something for the stateful phase and the lookups to find.
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        assert httpx.post(f"{url}/v1/tenants", json={"name": "fuzz-acme"}, headers=headers).status_code == 201
        # One registry credential of each scope besides the bootstrap token.
        tokens = {}
        for scope, body in (("admin", {"scope": "admin"}), ("maintainer", {"tenant": "fuzz-acme"})):
            made = httpx.post(f"{url}/v1/tokens", json={"name": f"fuzz-{scope}", **body}, headers=headers)
            assert made.status_code == 201, made.text
            tokens[scope] = made.json()["token"]
        yield url, log, tokens
    finally:
        proc.terminate()
        proc.wait(30)


def test_no_input_gives_a_server_error_or_an_undocumented_answer(registry_url, tmp_path):
    url, log, tokens = registry_url
    runs = [
        fuzz(f"{url}/openapi.json", {"Authorization": f"Bearer {ADMIN_TOKEN}"}, tmp_path, seed=seed) for seed in seeds()
    ]
    # A shorter run with each scoped credential (admin, a tenant's maintainer): a maintainer's refusals
    # (403 on admin routes and other tenants) must be documented answers too.
    for scope, token in tokens.items():
        scoped = tmp_path / scope
        scoped.mkdir()
        runs.append(
            fuzz(f"{url}/openapi.json", {"Authorization": f"Bearer {token}"}, scoped, seed=FIXED_SEED, max_time_s=45)
        )
    for who, run in zip(["bootstrap-admin"] * (len(runs) - len(tokens)) + list(tokens), runs, strict=True):
        (tmp_path / f"fuzz-{who}-{run.seed}.txt").write_text(run.output)
        print(f"registry API fuzz as {who}, {run.summary()} (output: {tmp_path}/fuzz-{who}-{run.seed}.txt)")
    for run in runs:
        assert run.exit_code == 0, f"{run.summary()}\n{run.output[-6000:]}\nregistry log:\n{log.read_text()[-2000:]}"
        assert run.cases > 100, run.summary()  # it really generated requests
