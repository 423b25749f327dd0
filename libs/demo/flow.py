"""The `lpx demo` flow: the platform end to end on local defaults, with real servers and processes.

1. the local stack (NATS JetStream, PostgreSQL, S3);  2. the base model;  3. one LoRA adapter per demo
tenant, trained with peft on its tone (cached after the first run);  4. the registry service: tenants,
adapter pushes (validated, stored content-addressed), activation;  5. a worker service (vLLM with LoRA);
6. the gateway (OpenAI-compatible HTTP); 7. a mixed batch through it with the official `openai` client:
each tenant's adapter and the base model in the same engine batch, each answer's applied digest checked
by the gateway against the one the registry resolved.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from libs.demo.processes import ServiceProcess
from libs.demo.tenants import TENANTS
from libs.paths import lpx_home
from libs.stack.procs import free_port

Log = Callable[[str], None]
POOL = "smollm2-135m-r16"
BASE = "smollm2-135m"
QUESTION = "Where is my order?"


@dataclass
class Answer:
    who: str
    model: str
    text: str
    digest: str | None  # what the worker applied, checked by the gateway against the registry's digest
    seconds: float


def train_adapters(base_path: Path, log: Log) -> dict[str, Path]:
    from libs.lora.format import adapter_digest
    from libs.lora.train import LoraRecipe, train_adapter

    recipe = LoraRecipe(steps=12, batch_size=2, seed=11)
    out = {}
    for tenant in TENANTS:
        key = hashlib.sha256(json.dumps([tenant.reply, repr(recipe)]).encode()).hexdigest()[:12]
        path = lpx_home() / "demo" / "adapters" / f"{tenant.name}-{key}"
        try:
            adapter_digest(path)
            log(f"adapter for {tenant.name} ({tenant.tone}) cached at {path}")
        except OSError:
            log(f"training {tenant.name}'s {tenant.tone} adapter with peft ({recipe.steps} steps, ~30 s)...")
            train_adapter(base_path, tenant.examples(), path, recipe,
                          on_step=lambda s, n, loss: log(f"  step {s}/{n} loss {loss:.3f}") if s % 4 == 0 else None)
        out[tenant.name] = path
    return out


def register_adapters(registry_url: str, admin: str, adapters: dict[str, Path], log: Log) -> dict[str, str]:
    """Tenants, pushes and activation through the registry's HTTP API. Returns tenant -> API key."""
    headers = {"Authorization": f"Bearer {admin}"}
    keys = {}
    with httpx.Client(base_url=registry_url, headers=headers, timeout=60) as http:
        for tenant in TENANTS:
            created = http.post("/v1/tenants", json={"name": tenant.name})
            if created.status_code == 409:  # a previous demo run: issue a fresh key
                created = http.post(f"/v1/tenants/{tenant.name}/keys")
            created.raise_for_status()
            keys[tenant.name] = created.json()["api_key"]
            path = adapters[tenant.name]
            files = [("files", (p.name, p.read_bytes())) for p in sorted(path.iterdir()) if p.is_file()]
            pushed = http.post("/v1/adapters", data={"tenant": tenant.name, "adapter": tenant.adapter,
                                                     "base_model": BASE}, files=files)  # fmt: skip
            pushed.raise_for_status()
            version = pushed.json()["version"]
            state = "new" if pushed.status_code == 201 else "already stored"
            log(f"{tenant.name}/{tenant.adapter}: v{version['number']} sha256 {version['digest'][:12]} ({state})")
            if version["status"] != "active":
                # The eval gate service is not built yet: activation is an explicit, recorded admin override.
                path = f"/v1/tenants/{tenant.name}/adapters/{tenant.adapter}/versions/{version['number']}/activate"
                override = {"actor": "lpx-demo", "reason": "demo: eval gate not deployed"}
                http.post(path, json=override).raise_for_status()
    return keys


async def ask_everyone(gateway_url: str, keys: dict[str, str], log: Log) -> list[Answer]:
    """One concurrent batch through the gateway with the official OpenAI client: each tenant asks its
    own adapter (alias `support`), and someone asks the base model; the vLLM worker batches them."""
    from openai import AsyncOpenAI

    plan = [(t.name, t.adapter, keys[t.name]) for t in TENANTS] + [("acme", BASE, keys["acme"])]

    async def ask(who: str, model: str, key: str) -> Answer:
        client = AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key=key, timeout=300, max_retries=0)
        started = time.monotonic()
        reply = await client.chat.completions.create(model=model, max_tokens=40, temperature=0,
                                                     messages=[{"role": "user", "content": QUESTION}])  # fmt: skip
        await client.close()
        return Answer(who if model != BASE else "(base model)", model, reply.choices[0].message.content.strip(),
                      reply.system_fingerprint, time.monotonic() - started)  # fmt: skip

    started = time.monotonic()
    answers = await asyncio.gather(*(ask(*p) for p in plan))
    log(f"mixed batch of {len(answers)} answered through the gateway in {time.monotonic() - started:.1f}s")
    return list(answers)


def run(stack, base_path: Path, log: Log) -> list[Answer]:
    adapters = train_adapters(base_path, log)
    env = {"LPX_ENV_FILE": str(stack.env_file), "HF_HUB_OFFLINE": "1"}
    logs = lpx_home() / "demo" / "logs"
    admin = secrets.token_urlsafe(16)
    port = free_port()
    registry = ServiceProcess("registry", "services.registry", {**env, "LPX_REGISTRY_PORT": str(port),
                              "LPX_REGISTRY_ADMIN_TOKEN": admin}, logs)  # fmt: skip
    worker = ServiceProcess("worker", "services.worker", {**env, "LPX_WORKER_WORKER_ID": "demo-worker-1",
                            "LPX_WORKER_POOL": POOL, "LPX_WORKER_BASE_MODEL": BASE,
                            "LPX_WORKER_MODEL_PATH": str(base_path), "LPX_WORKER_MAX_LORAS": "4",
                            "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}, logs)  # fmt: skip
    gateway_port = free_port()
    gateway = ServiceProcess("gateway", "services.gateway", {**env, "LPX_GATEWAY_HOST": "127.0.0.1",
                             "LPX_GATEWAY_PORT": str(gateway_port)}, logs)  # fmt: skip
    with registry, worker, gateway:  # the worker's engine starts (~40 s) while the registry takes the pushes
        registry.wait_http(f"http://127.0.0.1:{port}/healthz")
        log(f"registry up on :{port} (log {registry.log_path})")
        keys = register_adapters(f"http://127.0.0.1:{port}", admin, adapters, log)
        gateway.wait_http(f"http://127.0.0.1:{gateway_port}/healthz")
        log(f"gateway up on :{gateway_port} (OpenAI-compatible; log {gateway.log_path})")
        _wait_for_worker(stack, worker, log)
        answers = asyncio.run(ask_everyone(f"http://127.0.0.1:{gateway_port}", keys, log))
    log("gateway, worker and registry stopped (SIGTERM: they drain)")
    return answers


def _nats_url(stack) -> str:
    from libs.settings import ConnectionSettings

    return ConnectionSettings.load(stack.env_file).nats_url


def _wait_for_worker(stack, worker: ServiceProcess, log: Log, timeout_s: float = 300) -> None:
    import nats

    from libs.contracts import subjects

    async def beating() -> bool:
        nc = await nats.connect(_nats_url(stack))
        try:
            kv = await nc.jetstream().key_value(subjects.HEARTBEAT_BUCKET)
            await kv.get("demo-worker-1")
            return True
        except Exception:  # noqa: BLE001 - not yet
            return False
        finally:
            await nc.drain()

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        worker.check_alive()
        if asyncio.run(beating()):
            log(f"worker demo-worker-1 up (vLLM + LoRA, log {worker.log_path})")
            return
        time.sleep(1.0)
    raise TimeoutError("the worker did not come up")
