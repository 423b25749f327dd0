"""The registry in-process for benchmarks: a fresh database on the stack's PostgreSQL, the real app with
its lifespan (NATS responders, outbox), and an admin HTTP client over ASGI."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from libs.engine.profile import default_profile_path, load_profile

ADMIN_TOKEN = "b"


async def create_database(connections, db_name: str) -> str:
    """A fresh database `db_name` on the stack's PostgreSQL; its DSN."""
    import asyncpg

    conn = await asyncpg.connect(connections.pg_dsn.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await conn.execute(f'CREATE DATABASE "{db_name}"')
    finally:
        await conn.close()
    return connections.pg_dsn.rsplit("/", 1)[0] + "/" + db_name


async def start_registry(connections, db_name: str):
    """Create `db_name`, start the registry on it; returns (app, lifespan) — `await lifespan.__aexit__(
    None, None, None)` stops it."""
    from services.registry.api import create_app
    from services.registry.settings import RegistrySettings

    dsn = await create_database(connections, db_name)
    settings = RegistrySettings(connections=connections.model_copy(update={"pg_dsn": dsn}), admin_token=ADMIN_TOKEN)
    app = create_app(settings)
    lifespan = app.router.lifespan_context(app)
    await lifespan.__aenter__()
    return app, lifespan


@asynccontextmanager
async def registry_process(env_file: Path, db_name: str, log_path: Path, timeout_s: float = 120):
    """The registry as its own process (as deployed) on a fresh database `db_name`; yields its URL. For
    benchmarks that drive load from their own event loop: a registry inside it answers the gateways'
    resolves late, and they serve errors ("registry unavailable") for what they have not cached."""
    from libs.fleet import free_port
    from libs.settings import ConnectionSettings

    dsn = await create_database(ConnectionSettings.load(env_file), db_name)
    port = free_port()
    env = {
        **os.environ,
        "LPX_ENV_FILE": str(env_file),
        "LPX_PG_DSN": dsn,
        "LPX_REGISTRY_HOST": "127.0.0.1",
        "LPX_REGISTRY_PORT": str(port),
        "LPX_REGISTRY_ADMIN_TOKEN": ADMIN_TOKEN,
    }
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.registry"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        await _until_ready(url, proc, timeout_s, log_path)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


async def _until_ready(url: str, proc: subprocess.Popen, timeout_s: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=5) as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the registry exited with {proc.returncode}; its log: {log_path}")
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(f"{url}/readyz")).status_code == 200:
                    return
            await asyncio.sleep(0.5)
    raise RuntimeError(f"the registry was not ready within {timeout_s:.0f} s; its log: {log_path}")


def admin_http(url: str) -> httpx.AsyncClient:
    """An admin client of a registry process."""
    return httpx.AsyncClient(base_url=url, timeout=120, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})


def admin_client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://registry",
        timeout=120,
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )


def adapter_files(path: Path) -> list[tuple]:
    """An adapter directory as the registry's multipart push expects it."""
    files = sorted(f for f in path.iterdir() if f.is_file())
    return [("files", (f.name, f.read_bytes(), "application/octet-stream")) for f in files]


@asynccontextmanager
async def stack_with_tenants(name: str, tenants: list[str]):
    """A fresh local stack in a temporary folder and the registry in-process with `tenants` created;
    yields (stack, state folder, tenant -> API key). Everything is stopped and deleted afterwards."""
    from libs.settings import ConnectionSettings
    from libs.stack import Stack, StackConfig

    state = Path(tempfile.mkdtemp(prefix=f"lpx-bench-{name}-"))
    os.chmod(state, 0o755)
    stack = Stack(StackConfig(dir=state / "stack"))
    stack.up()
    lifespan = None
    try:
        app, lifespan = await start_registry(ConnectionSettings.load(stack.env_file), f"{name}_{uuid.uuid4().hex[:8]}")
        async with admin_client(app) as client:
            keys = {t: (await client.post("/v1/tenants", json={"name": t})).json()["api_key"] for t in tenants}
        yield stack, state, keys
    finally:
        if lifespan is not None:
            await lifespan.__aexit__(None, None, None)
        stack.purge()


def sim_pool_parser(doc: str | None) -> argparse.ArgumentParser:
    """The options of a benchmark on a pool of simulated workers (bench_fairness, bench_slo)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--capacity", type=int, default=8, help="sequences per worker")
    parser.add_argument("--decode-tok-s", type=float, default=32.0, help="simulated decode rate per sequence")
    parser.add_argument("--tokens", type=int, default=32, help="max_tokens per request")
    parser.add_argument("--duration", type=float, default=30.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds sent before measuring")
    parser.add_argument(
        "--sim-profile",
        default=str(default_profile_path("smollm2-135m")),
        help="engine profile the simulated workers follow (step time grows with the batch, as measured on the "
        "real engine; --decode-tok-s is then ignored); 'none': a fixed --decode-tok-s per sequence",
    )
    return parser


def sim_profile(args) -> Path | None:
    return None if args.sim_profile in (None, "", "none") else Path(args.sim_profile)


def capacity_rps(args) -> float:
    """Requests per second the simulated pool completes when full: every sequence slot busy."""
    path = sim_profile(args)
    profile = load_profile(path, "smollm2-135m") if path else None
    per_sequence_tok_s = 1.0 / profile.step_s(args.capacity) if profile else args.decode_tok_s
    return args.workers * args.capacity * per_sequence_tok_s / args.tokens
