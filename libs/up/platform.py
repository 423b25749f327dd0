"""The local platform: the stack plus every service under supervisord, started in dependency order.

State in `$LPX_HOME/up`: `platform.json` (ports, workers, bases: kept, so URLs stay valid across
`lpx up` runs), `admin-token` (0600), `platform.env` (what the CLI reads to find the registry and the
gateway), `services/<name>.json` (module + env per service), `starts/<name>.jsonl` (one line per start:
restart counts and crash-loop detection), `logs/<name>.log`, and supervisord's config, socket and pid.
"""

from __future__ import annotations

import json
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from libs.paths import platform_env_file, stack_env_file, up_dir
from libs.stack.procs import free_port
from libs.up import plan
from libs.up.health import port_free, service_health
from libs.up.plan import PlanError, Running, ServiceSpec
from libs.up.runner import read_starts
from libs.up.settings import UpSettings
from libs.up.supervisor import BACKOFF, FATAL, RUNNING, STARTING, Supervisor

Log = Callable[[str], None]


class UpError(RuntimeError):
    """`lpx up` could not bring the platform up; the message says why and what to do."""


@dataclass(frozen=True)
class Row:
    """One line of `lpx ps`."""

    name: str
    pid: int | None
    state: str  # running | starting | crash-looping | stopped | exited
    restarts: int
    port: int | None
    health: str  # ok | failing | -
    uptime_s: float | None
    last_lines: list[str]


@dataclass(frozen=True)
class Endpoints:
    gateway_url: str
    registry_url: str
    admin_token_file: Path
    env_file: Path
    logs: Path
    gateway_metrics_url: str | None = None  # the gateway's Prometheus endpoint (`lpx top` reads it)


class LocalPlatform:
    def __init__(self, settings: UpSettings | None = None, stack=None) -> None:
        from libs.stack import Stack, StackConfig

        self.settings = settings or UpSettings()
        self.stack = stack or Stack(StackConfig())
        self.state = up_dir()
        self.supervisor = Supervisor(self.state)
        self.record_file = self.state / "platform.json"
        self.token_file = self.state / "admin-token"

    # --- lpx up --------------------------------------------------------------------------------
    def up(self, workers: int | None = None, on_event: Log = lambda msg: None) -> Endpoints:
        bases = plan.fetched_bases()
        if not bases:
            raise UpError(
                f"no base model under {plan.models_dir()}: run `lpx model fetch smollm2-135m` (or `make model`) first"
            )
        record = self._record()
        fresh = not self.supervisor.running()
        specs = self._plan(bases, workers, record, fresh=fresh)
        stack_was_up = bool(self.stack.status()) and all(row.healthy for row in self.stack.status())
        try:
            self.stack.up(on_event=on_event)
        except Exception as exc:
            raise UpError(f"the local stack did not start: {exc}") from None
        self._write_client_env()
        try:
            self.run_services(specs, on_event)
        except Exception:
            if fresh and not stack_was_up:
                self.stack.down()
            raise
        return self.endpoints()

    def run_services(self, specs: list[ServiceSpec], on_event: Log = lambda msg: None) -> None:
        """Write the services' specs and supervisord's config, start supervisord if it is not running
        (or make it pick up the new config), then start the services stage by stage, each stage healthy
        before the next. A first start that fails stops everything it started."""
        fresh = not self.supervisor.running()
        self._write(specs)
        try:
            if fresh:
                shutil.rmtree(self.state / "starts", ignore_errors=True)  # restarts count from this `lpx up`
                self.supervisor.start_daemon()
                on_event(f"supervisord started (config {self.supervisor.conf})")
            else:
                self.supervisor.reload()
            self._start_in_order(specs, on_event)
        except Exception:
            if fresh:
                on_event("start-up failed: stopping what this call started")
                self._stop_services()
            raise

    def _plan(self, bases: list[str], workers: int | None, record: dict, *, fresh: bool) -> list[ServiceSpec]:
        """A fresh start checks its ports are free; a second `lpx up` keeps them and sizes only what it adds."""
        requested = workers or self.settings.workers or record.get("workers_requested")
        count = plan.worker_count(self.settings, len(bases), requested, Running() if fresh else self._running())
        ports = {
            "registry": self._port("registry", self.settings.registry_port, record, fresh),
            "gateway": self._port("gateway", self.settings.gateway_port, record, fresh),
            "gateway_metrics": self._port("gateway_metrics", self.settings.gateway_metrics_port, record, fresh),
        }
        self.state.mkdir(parents=True, exist_ok=True)
        record.update(
            {"ports": ports, "workers": count, "workers_requested": requested, "bases": bases},
        )
        self.record_file.write_text(json.dumps(record, indent=2))
        return plan.build(
            bases=bases,
            workers=count,
            registry_port=ports["registry"],
            gateway_port=ports["gateway"],
            admin_token=self._admin_token(),
            env_file=stack_env_file(),
            state=self.state,
            gateway_metrics_port=ports["gateway_metrics"],
        )

    def _running(self) -> Running:
        """The services of a platform already up, as memory already taken (a second `lpx up`)."""
        up = {name for name, info in self.supervisor.processes().items() if info.state in (RUNNING, STARTING)}
        return Running(
            workers=sum(name.startswith("worker-") for name in up),
            fixed="trainer" in up or any(name.startswith("eval-gate-") for name in up),
        )

    def _port(self, service: str, pinned: int, record: dict, check: bool) -> int:
        port = pinned or record.get("ports", {}).get(service) or free_port()
        if check and not port_free(port):
            variable = f"LPX_UP_{service.upper()}_PORT"
            raise PlanError(
                f"port {port} for the {service.replace('_', ' ')} is taken by another process: stop it, or set "
                f"{variable} to a free port (`lpx down --purge` forgets the ports chosen before)"
            )
        return port

    def _admin_token(self) -> str:
        if not self.token_file.exists():
            self.state.mkdir(parents=True, exist_ok=True)
            self.token_file.touch(mode=0o600)
            self.token_file.write_text(secrets.token_urlsafe(24))
        return self.token_file.read_text().strip()

    def _write(self, specs: list[ServiceSpec]) -> None:
        services = self.state / "services"
        services.mkdir(parents=True, exist_ok=True)
        for stale in services.glob("*.json"):
            stale.unlink()
        for order, spec in enumerate(specs):
            path = services / f"{spec.name}.json"
            path.touch(mode=0o600)  # the env holds the admin token
            path.write_text(json.dumps({"order": order, **asdict(spec)}))
        self.supervisor.write_config(specs)

    def _write_client_env(self) -> None:
        ends = self.endpoints()
        env_file = platform_env_file()
        env_file.touch(mode=0o600)
        env_file.write_text(
            "# written by `lpx up`: the CLI finds the local platform here\n"
            f"LPX_REGISTRY_URL={ends.registry_url}\n"
            f"LPX_REGISTRY_ADMIN_TOKEN={self._admin_token()}\n"
            f"LPX_GATEWAY_URL={ends.gateway_url}\n"
            + (f"LPX_TOP_METRICS={json.dumps([ends.gateway_metrics_url])}\n" if ends.gateway_metrics_url else "")
        )

    def _start_in_order(self, specs: list[ServiceSpec], on_event: Log) -> None:
        running = self.supervisor.processes()
        for stage in sorted({spec.stage for spec in specs}):
            group = [spec for spec in specs if spec.stage == stage]
            for spec in group:
                if running.get(spec.name) and running[spec.name].state == RUNNING:
                    on_event(f"{spec.name}: already running (pid {running[spec.name].pid})")
                    continue
                self.supervisor.start(spec.name)
                on_event(f"{spec.name}: started (log {self.supervisor.log_path(spec.name)})")
            self._wait_healthy(group, on_event)

    def _wait_healthy(self, group: list[ServiceSpec], on_event: Log) -> None:
        deadline = time.monotonic() + self.settings.start_timeout_s
        waiting = {spec.name: spec for spec in group}
        while waiting:
            infos = self.supervisor.processes()
            for name in [n for n, info in infos.items() if n in waiting and self._crash_looping(n, info)]:
                raise UpError(f"{name} keeps exiting at start-up; last log lines:\n{self._tail(name, 15)}")
            for name, healthy in service_health(list(waiting.values()), infos).items():
                if healthy:
                    on_event(f"{name}: healthy")
                    del waiting[name]
            if waiting and time.monotonic() > deadline:
                names = ", ".join(sorted(waiting))
                raise UpError(f"not healthy after {self.settings.start_timeout_s:.0f}s: {names} (lpx logs NAME)")
            if waiting:
                time.sleep(0.5)

    # --- lpx ps / logs / restart / down --------------------------------------------------------
    def ps(self) -> list[Row]:
        if not self.supervisor.running():
            return []
        specs = self._specs()
        infos = self.supervisor.processes()
        health = service_health(list(specs.values()), infos)
        return [self._row(spec, infos.get(name), health.get(name, False)) for name, spec in specs.items()]

    def _row(self, spec: ServiceSpec, info, healthy: bool) -> Row:
        now = time.time()
        restarts = max(0, len(read_starts(self.state, spec.name)) - 1)
        state = info.state.lower() if info else "unknown"
        looping = self._crash_looping(spec.name, info)
        if looping:
            state = "crash-looping"
        running = info is not None and info.state == RUNNING
        return Row(
            name=spec.name,
            pid=info.pid if running else None,
            state=state,
            restarts=restarts,
            port=spec.port,
            health="ok" if healthy else ("failing" if running else "-"),
            uptime_s=now - info.started_at if running else None,
            last_lines=self._tail(spec.name, 5).splitlines() if looping else [],
        )

    def _crash_looping(self, name: str, info) -> bool:
        """supervisord gave up (FATAL) or is backing off, or our runner restarted it more than
        `crash_loop_restarts` times within two backoff windows (it outlived supervisord's 3 s)."""
        if info is not None and info.state in (FATAL, BACKOFF):
            return True
        now = time.time()
        recent = [t for t in read_starts(self.state, name) if now - t < 2 * self.settings.backoff_window_s]
        return len(recent) > self.settings.crash_loop_restarts

    def _specs(self) -> dict[str, ServiceSpec]:
        """The services as `lpx up` last wrote them, in start order."""
        rows = [json.loads(path.read_text()) for path in (self.state / "services").glob("*.json")]
        rows.sort(key=lambda row: row.pop("order"))
        return {row["name"]: ServiceSpec(**row) for row in rows}

    def names(self, pattern: str) -> list[str]:
        """Services named `pattern`, or starting with it (`worker` = every worker)."""
        specs = self._specs()
        if pattern in specs:
            return [pattern]
        matches = [name for name in specs if name.startswith(pattern)]
        if not matches:
            known = ", ".join(specs) or "none (run `lpx up`)"
            raise UpError(f"no service {pattern!r}; the services are: {known}")
        return matches

    def restart(self, pattern: str, on_event: Log = lambda msg: None) -> None:
        if not self.supervisor.running():
            raise UpError("the platform is not running: `lpx up`")
        for name in self.names(pattern):
            self.supervisor.stop(name)
            self.supervisor.start(name)
            on_event(f"{name}: restarted")

    def log_file(self, name: str) -> Path:
        (name,) = self.names(name)[:1]
        return self.supervisor.log_path(name)

    def down(self, purge: bool = False, on_event: Log = lambda msg: None) -> None:
        if self.supervisor.running():
            on_event("stopping the services (SIGTERM; workers drain)...")
            self._stop_services()
            on_event("services stopped")
        self.stack.down(on_event=on_event)
        if purge:
            self.stack.purge()
            shutil.rmtree(self.state, ignore_errors=True)
            on_event(f"deleted {self.state} and the stack's data")

    def _stop_services(self) -> None:
        try:
            self.supervisor.stop_all()
        finally:
            self.supervisor.shutdown()

    # --- state ---------------------------------------------------------------------------------
    def endpoints(self) -> Endpoints:
        ports = self._record().get("ports", {})
        metrics = ports.get("gateway_metrics")  # absent in a platform record from before it had one
        return Endpoints(
            gateway_url=f"http://127.0.0.1:{ports.get('gateway')}",
            registry_url=f"http://127.0.0.1:{ports.get('registry')}",
            gateway_metrics_url=f"http://127.0.0.1:{metrics}/metrics" if metrics else None,
            admin_token_file=self.token_file,
            env_file=platform_env_file(),
            logs=self.supervisor.logs,
        )

    def _record(self) -> dict:
        return json.loads(self.record_file.read_text()) if self.record_file.exists() else {}

    def _tail(self, name: str, lines: int) -> str:
        path = self.supervisor.log_path(name)
        if not path.exists():
            return "(no log yet)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


__all__ = ["LocalPlatform", "UpError", "PlanError", "Row", "Endpoints"]
