"""Which services `lpx up` runs on this machine, with what settings, in which order.

Order is dependency order: the registry first (everything resolves and pushes through it), then the
eval gates, the trainer and the workers (they only need the stack), the gateway last (it needs live
workers to route to). A pool per fetched base model: `<base>-r16`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from libs.models.bootstrap import MANIFEST
from libs.paths import models_dir
from libs.up.settings import UpSettings

GIB = 1024**3


@dataclass(frozen=True)
class ServiceSpec:
    name: str  # the supervisord program name, `lpx ps` row and log file name
    module: str  # python -m <module>
    env: dict[str, str]
    stage: int  # started after every lower stage is up
    port: int | None = None  # HTTP port, for the services that have one
    health: str = "running"  # running | http:<path> | heartbeat:<worker id>
    stop_wait_s: int = 30  # SIGTERM, then this long to drain before SIGKILL


class PlanError(RuntimeError):
    """A reason `lpx up` cannot lay the platform out, with the fix."""


def fetched_bases(root: Path | None = None) -> list[str]:
    root = root or models_dir()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / MANIFEST).is_file())


def pool_name(base: str) -> str:
    return f"{base.replace('.', '-')}-r16"


def program_name(*parts: str) -> str:
    return "-".join(parts).replace(".", "-").replace(":", "-")


def available_memory_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / GIB
    except OSError:
        pass
    return float("inf")  # unknown: do not refuse


@dataclass(frozen=True)
class Running:
    """What a platform already up holds in memory: a second `lpx up` sizes only what it adds."""

    workers: int = 0  # worker processes running, all pools together
    fixed: bool = False  # the eval gates and the trainer (the fixed share) are running


def worker_count(settings: UpSettings, pools: int, requested: int | None, running: Running = Running()) -> int:
    """Workers per pool: the request if it fits in memory, else a clear refusal; by default what fits.
    Memory held by services already running is not counted again (it is not available any more, and
    needs not be)."""
    available = available_memory_gib()
    free = available - (0 if running.fixed else settings.fixed_memory_gib)
    fits = (running.workers + int(max(free, 0) // settings.worker_memory_gib)) // pools
    if requested is not None:
        if requested > fits:
            need = settings.fixed_memory_gib + requested * pools * settings.worker_memory_gib
            held = f" ({running.workers} worker(s) already running)" if running.workers else ""
            raise PlanError(
                f"{requested} worker(s) per pool need about {need:.0f} GiB of memory, "
                f"{available:.1f} GiB is available{held}: use --workers {max(fits, 1)} "
                f"or fewer (or LPX_UP_WORKER_MEMORY_GIB if your workers are smaller)"
            )
        return requested
    if fits < 1:
        raise PlanError(
            f"not enough memory for one worker: {available:.1f} GiB available, about "
            f"{settings.fixed_memory_gib + settings.worker_memory_gib:.0f} GiB needed"
        )
    by_cores = max(1, (os.cpu_count() or 2) // 2)
    return max(1, min(fits, by_cores, settings.max_workers))


def build(
    *,
    bases: list[str],
    workers: int,
    registry_port: int,
    gateway_port: int,
    admin_token: str,
    env_file: Path,
    state: Path,
    gateway_metrics_port: int = 0,
) -> list[ServiceSpec]:
    common = {
        "LPX_ENV_FILE": str(env_file),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
    }
    specs = [registry(common, registry_port, admin_token), trainer(common, registry_port, admin_token, state)]
    for base in bases:
        specs.append(eval_gate(common, base, state))
        specs.extend(worker(common, base, i, state) for i in range(1, workers + 1))
    specs.append(gateway(common, gateway_port, bases, gateway_metrics_port))
    return specs


def registry(common: dict, port: int, admin_token: str) -> ServiceSpec:
    env = {"LPX_REGISTRY_HOST": "127.0.0.1", "LPX_REGISTRY_PORT": str(port), "LPX_REGISTRY_ADMIN_TOKEN": admin_token}
    return ServiceSpec("registry", "services.registry", {**common, **env}, stage=0, port=port, health="http:/healthz")


def trainer(common: dict, registry_port: int, admin_token: str, state: Path) -> ServiceSpec:
    env = {
        "LPX_TRAINER_REGISTRY_URL": f"http://127.0.0.1:{registry_port}",
        "LPX_TRAINER_ADMIN_TOKEN": admin_token,
        "LPX_TRAINER_TRAINER_ID": "up-trainer",
        "LPX_TRAINER_WORK_DIR": str(state / "work" / "trainer"),
    }
    return ServiceSpec("trainer", "services.trainer", {**common, **env}, stage=1)


def eval_gate(common: dict, base: str, state: Path) -> ServiceSpec:
    env = {
        "LPX_EVAL_GATE_BASE_MODEL": base,
        "LPX_EVAL_GATE_MODEL_PATH": str(models_dir() / base),
        "LPX_EVAL_GATE_GATE_ID": program_name("up-gate", base),
        "LPX_EVAL_GATE_WORK_DIR": str(state / "work" / f"gate-{base}"),
    }
    return ServiceSpec(program_name("eval-gate", base), "services.eval_gate", {**common, **env}, stage=1)


def worker(common: dict, base: str, index: int, state: Path) -> ServiceSpec:
    pool = pool_name(base)
    worker_id = program_name("up", pool, str(index))
    env = {
        "LPX_WORKER_WORKER_ID": worker_id,
        "LPX_WORKER_POOL": pool,
        "LPX_WORKER_BASE_MODEL": base,
        "LPX_WORKER_MODEL_PATH": str(models_dir() / base),
        "LPX_WORKER_MAX_LORAS": "4",
        "LPX_WORKER_DISK_CACHE_DIR": str(state / "work" / f"cache-{worker_id}"),
    }
    name = program_name("worker", pool, str(index))
    # Workers drain on SIGTERM: what they run finishes, what is queued goes to the pool.
    return ServiceSpec(
        name, "services.worker", {**common, **env}, stage=1, health=f"heartbeat:{worker_id}", stop_wait_s=120
    )


def gateway(common: dict, port: int, bases: list[str], metrics_port: int = 0) -> ServiceSpec:
    env = {
        "LPX_GATEWAY_HOST": "127.0.0.1",
        "LPX_GATEWAY_PORT": str(port),
        "LPX_GATEWAY_GATEWAY_ID": "up-gateway",
        "LPX_GATEWAY_BASE_MODELS": json.dumps(bases),
    }
    if metrics_port:  # per-tenant HTTP status counts for `lpx top`, on loopback only
        env |= {"LPX_GATEWAY_METRICS_PORT": str(metrics_port), "LPX_GATEWAY_METRICS_HOST": "127.0.0.1"}
    return ServiceSpec(
        "gateway", "services.gateway", {**common, **env}, stage=2, port=port, health="http:/readyz", stop_wait_s=45
    )
