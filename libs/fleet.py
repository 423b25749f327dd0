"""A fleet of loraplex processes on one machine: N gateways and M simulated workers against a running
stack, for fleet tests and `benchmarks/bench_fleet.py`.

Gateways are `python -m services.gateway` and workers `python -m services.worker` with
LPX_WORKER_ENGINE=sim (the real worker code on the simulated engine, no model loaded), each in its own
process group so a test can SIGKILL one. Logs go to `<state>/<name>.log`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from libs.stack.procs import process_alive as alive


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class FleetSpec:
    base_model: str = "smollm2-135m"
    pool: str = "fleet-smollm2-r16"
    max_loras: int = 4
    max_cpu_loras: int = 16
    capacity: int = 16  # requests a worker generates at once
    decode_tok_s: float = 200.0  # simulated, per sequence
    prefill_tok_s: float = 4000.0
    # A measured engine profile the simulated workers follow instead of the two rates (a full batch
    # slows each sequence, as on the real engine): libs/engine/profiles/. None: the fixed rates.
    sim_profile: Path | None = None
    routing_policy: str = "bounded_load"
    load_signal: str = "fleet"
    # The workers check the pool's load bound again as they take work (services/worker/load_bound.py);
    # off: the gateways' bound alone (the fleet benchmark's comparison, and the baseline policies).
    load_bound: bool = True
    heartbeat_interval_s: float = 0.5
    heartbeat_ttl_s: float = 3.0
    log_level: str = "WARNING"


@dataclass
class Fleet:
    env_file: Path  # the stack's connection settings (LPX_ENV_FILE)
    state: Path
    spec: FleetSpec = field(default_factory=FleetSpec)
    gateways: dict[str, tuple[subprocess.Popen, str]] = field(default_factory=dict)  # id -> (process, url)
    workers: dict[str, subprocess.Popen] = field(default_factory=dict)
    # Where each process's current run starts in its log: a restarted process appends to the same log,
    # and its earlier run's ready line must not count as this run's.
    _log_starts: dict[str, int] = field(default_factory=dict, init=False, repr=False)

    def _spawn(self, module: str, env: dict, log_name: str) -> subprocess.Popen:
        self.state.mkdir(parents=True, exist_ok=True)
        path = self.state / f"{log_name}.log"
        self._log_starts[log_name] = path.stat().st_size if path.exists() else 0
        log = open(path, "ab")
        full = {**os.environ, "LPX_ENV_FILE": str(self.env_file), **env}
        return subprocess.Popen(
            [sys.executable, "-m", module], env=full, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def start_gateway(self, gateway_id: str, extra: dict[str, str] | None = None) -> str:
        """A gateway process; `extra` adds or overrides its settings (LPX_GATEWAY_...)."""
        s, port = self.spec, free_port()
        env = {
            "LPX_GATEWAY_PORT": str(port),
            "LPX_GATEWAY_HOST": "127.0.0.1",
            "LPX_GATEWAY_GATEWAY_ID": gateway_id,
            "LPX_GATEWAY_HEARTBEAT_STALENESS_S": str(s.heartbeat_ttl_s),
            "LPX_GATEWAY_POOL_POLL_S": "0.25",
            "LPX_GATEWAY_DRAIN_GRACE_S": "5",
            "LPX_GATEWAY_BASE_MODELS": f'["{s.base_model}"]',
            "LPX_GATEWAY_ROUTING_POLICY": s.routing_policy,
            "LPX_GATEWAY_LOAD_SIGNAL": s.load_signal,
            "LPX_GATEWAY_LOG_LEVEL": s.log_level,
        }
        env.update(extra or {})
        url = f"http://127.0.0.1:{port}"
        self.gateways[gateway_id] = (self._spawn("services.gateway", env, gateway_id), url)
        return url

    def start_worker(self, worker_id: str, extra: dict[str, str] | None = None) -> None:
        """A simulated worker process; `extra` adds or overrides its settings (LPX_WORKER_...)."""
        s = self.spec
        env = {
            "LPX_WORKER_WORKER_ID": worker_id,
            "LPX_WORKER_POOL": s.pool,
            "LPX_WORKER_BASE_MODEL": s.base_model,
            "LPX_WORKER_ENGINE": "sim",
            "LPX_WORKER_SIM_DECODE_TOK_S": str(s.decode_tok_s),
            "LPX_WORKER_SIM_PREFILL_TOK_S": str(s.prefill_tok_s),
            "LPX_WORKER_MODEL_PATH": str(self.state),
            "LPX_WORKER_MAX_LORAS": str(s.max_loras),
            "LPX_WORKER_MAX_CPU_LORAS": str(s.max_cpu_loras),
            "LPX_WORKER_CAPACITY": str(s.capacity),
            "LPX_WORKER_MAX_NUM_SEQS": str(s.capacity),
            "LPX_WORKER_DISK_CACHE_DIR": str(self.state / f"cache-{worker_id}"),
            "LPX_WORKER_HEARTBEAT_INTERVAL_S": str(s.heartbeat_interval_s),
            "LPX_WORKER_HEARTBEAT_TTL_S": str(s.heartbeat_ttl_s),
            # The gateways' staleness (LPX_GATEWAY_HEARTBEAT_STALENESS_S): placement sees their ring.
            "LPX_WORKER_PLACEMENT_STALENESS_S": str(s.heartbeat_ttl_s),
            "LPX_WORKER_LOG_LEVEL": s.log_level,
            "LPX_WORKER_LOAD_BOUND": "true" if s.load_bound else "false",
        }
        if s.sim_profile is not None:
            env["LPX_WORKER_SIM_PROFILE"] = str(s.sim_profile)
        env.update(extra or {})
        self.workers[worker_id] = self._spawn("services.worker", env, worker_id)

    def up(self, gateways: int, workers: int) -> list[str]:
        """Start `gateways` gateways (gw-0...) and `workers` simulated workers (sim-0...); their URLs."""
        urls = [self.start_gateway(f"gw-{i}") for i in range(gateways)]
        for i in range(workers):
            self.start_worker(f"sim-{i}")
        return urls

    @staticmethod
    def kill(proc: subprocess.Popen) -> None:
        """SIGKILL, no drain: the crash case."""
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    async def wait_ready(self, workers: int, timeout_s: float = 180) -> None:
        """Every running worker started (its ready line), and every gateway ready and seeing `workers` live
        workers in the fleet's pool (beside `lpx up`, the platform's own workers are live too)."""
        deadline = time.monotonic() + timeout_s
        await self._wait_workers_started(deadline)
        async with httpx.AsyncClient(timeout=5) as http:
            for gateway_id, (proc, url) in self.gateways.items():
                while True:
                    if proc.poll() is not None:
                        raise RuntimeError(f"{gateway_id} exited: {self.log_tail(gateway_id)}")
                    try:
                        seen = (await http.get(f"{url}/readyz")).json().get("pools", {}).get(self.spec.pool, 0)
                        if seen == workers:
                            break
                    except (httpx.HTTPError, ValueError):
                        pass
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{gateway_id} never saw {workers} workers in pool {self.spec.pool}")
                    await asyncio.sleep(0.25)

    async def _wait_workers_started(self, deadline: float) -> None:
        """A worker prints its ready line once it consumes, reports its load and listens to the pool's
        (services/worker/__main__.py): a test without gateways has nothing else to wait on."""
        for worker_id, proc in self.workers.items():
            while proc.poll() is None and f"worker {worker_id} ready" not in self.this_run_log(worker_id):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"worker {worker_id} never started: {self.log_tail(worker_id)}")
                await asyncio.sleep(0.25)

    def this_run_log(self, name: str) -> str:
        """What the process's current run wrote to its log."""
        path = self.state / f"{name}.log"
        if not path.exists():
            return ""
        with open(path, "rb") as log:
            log.seek(self._log_starts.get(name, 0))
            return log.read().decode(errors="replace")

    def log_tail(self, name: str, lines: int = 20) -> str:
        path = self.state / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self, timeout_s: float = 30) -> None:
        """SIGTERM everything (workers drain, gateways finish), SIGKILL what is left after `timeout_s`."""
        procs = [p for p, _ in self.gateways.values()] + list(self.workers.values())
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self.gateways.clear()
        self.workers.clear()


# --- a fleet left running by `lpx fleet up`, found again by `lpx fleet status|down` ------------------
def save(fleet: Fleet, path: Path) -> None:
    record = {
        "gateways": {g: {"pid": p.pid, "url": url} for g, (p, url) in fleet.gateways.items()},
        "workers": {w: {"pid": p.pid} for w, p in fleet.workers.items()},
        "state": str(fleet.state),
    }
    path.write_text(json.dumps(record, indent=2))


def stop_recorded(path: Path, timeout_s: float = 30) -> int:
    """SIGTERM every process recorded in `path` (its process group), SIGKILL stragglers; how many ran."""
    record = json.loads(path.read_text())
    pids = [g["pid"] for g in record["gateways"].values()] + [w["pid"] for w in record["workers"].values()]
    running = [pid for pid in pids if alive(pid)]
    for pid in running:
        with _suppress_lookup():
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while any(alive(pid) for pid in running) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in running:
        if alive(pid):
            with _suppress_lookup():
                os.killpg(pid, signal.SIGKILL)
    path.unlink()
    return len(running)


def _suppress_lookup():
    import contextlib

    return contextlib.suppress(ProcessLookupError)
