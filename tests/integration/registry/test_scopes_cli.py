"""`lpx tenant token create|list|revoke` and `lpx audit` against the in-process registry on real
PostgreSQL, with the bootstrap admin token and with a maintainer's credential (LPX_REGISTRY_TOKEN).
The CLI runs in a thread; its HTTP calls are handed to the test's event loop, where the app lives."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest
from typer.testing import CliRunner

from libs.cli import registry_cmds
from libs.cli.main import app
from tests.integration.registry.conftest import ADMIN_TOKEN

pytestmark = pytest.mark.integration


class LoopTransport(httpx.BaseTransport):
    """A sync transport that sends each request through the registry's async ASGI client on `loop`."""

    def __init__(self, client: httpx.AsyncClient, loop: asyncio.AbstractEventLoop) -> None:
        self.client, self.loop = client, loop

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()

        async def send() -> httpx.Response:
            headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
            return await self.client.request(
                request.method, request.url.raw_path.decode(), headers=headers, content=body
            )

        reply = asyncio.run_coroutine_threadsafe(send(), self.loop).result(60)
        return httpx.Response(reply.status_code, headers={"content-type": "application/json"}, content=reply.content)


@pytest.fixture
def lpx(registry, monkeypatch):
    loops: list[asyncio.AbstractEventLoop] = []  # the test's running loop (a sync fixture has none yet)

    def client() -> httpx.Client:  # the CLI's own headers (its credential), sent through the test's loop
        _, headers = registry_cmds.registry_settings()
        return httpx.Client(
            base_url="http://registry", headers=headers, transport=LoopTransport(registry.client, loops[-1])
        )

    monkeypatch.setattr(registry_cmds, "_client", client)

    async def run(token: str, *args: str):
        loops.append(asyncio.get_running_loop())
        monkeypatch.setenv("LPX_REGISTRY_TOKEN", token)
        result = await asyncio.to_thread(CliRunner().invoke, app, list(args))
        return result

    return run


async def test_tokens_and_audit_from_the_cli_as_admin_and_as_maintainer(registry, lpx, monkeypatch):
    tenant = f"cli-{uuid.uuid4().hex[:6]}"
    await registry.create_tenant(tenant)

    made = await lpx(ADMIN_TOKEN, "tenant", "token", "create", tenant, "--name", "cli-ml")
    assert made.exit_code == 0, made.output
    token = made.stdout.strip().splitlines()[-1]
    assert token.startswith("lpxr_")

    ci = await lpx(token, "tenant", "token", "create", tenant, "--name", "cli-ci", "--expires-in", "1d")
    assert ci.exit_code == 0, ci.output
    listed = await lpx(token, "tenant", "token", "list")
    assert listed.exit_code == 0 and "cli-ml" in listed.stdout and "cli-ci" in listed.stdout, listed.output
    ci_id = ci.stdout.strip().splitlines()[-1].split("_")[1]
    revoked = await lpx(token, "tenant", "token", "revoke", ci_id)
    assert revoked.exit_code == 0 and "revoked" in revoked.stdout, revoked.output

    refused = await lpx(token, "tenant", "token", "create", "--admin", "--name", "root")
    assert refused.exit_code == 1 and "admin credentials" in refused.output
    limits = await lpx(token, "tenant", "limits", tenant, "--rps", "5")
    assert limits.exit_code == 1 and "admin scope" in limits.output

    trail = await lpx(token, "audit", "--json", "--since", "1h")
    assert trail.exit_code == 0, trail.output
    entries = json.loads(trail.stdout)
    assert {e["tenant"] for e in entries} == {tenant}
    assert [(e["action"], e["actor"]) for e in entries][-3:] == [
        ("credential.created", "bootstrap-admin"),
        ("credential.created", "cli-ml"),
        ("credential.revoked", "cli-ml"),
    ]
    monkeypatch.setattr(registry_cmds.out, "width", 250)  # a wide terminal: nothing elided
    table = await lpx(ADMIN_TOKEN, "audit", tenant)
    assert table.exit_code == 0 and "credential.revoked" in table.stdout and "maintainer" in table.stdout
