"""Start, inspect and stop the local stack.

State lives in one directory (default `$LPX_HOME/stack`): `stack.json` (ports, generated credentials,
pids), `stack.env` (what clients read), and one sub-directory per server with its data and log.
Every pid is recorded the moment its process starts, so `down` can clean up even after `up` was
killed with SIGKILL; an `up` interrupted by a signal stops what it started before exiting.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from libs.contracts.subjects import STREAMS
from libs.paths import stack_dir
from libs.stack import procs
from libs.stack.servers import (
    NatsServer,
    PostgresServer,
    S3Server,
    Server,
    ServerContext,
    StackError,
    admin_auth,
    nats_secrets,
    port_names,
    postgres_dir,
)

log = logging.getLogger(__name__)

__all__ = ["Stack", "StackConfig", "StackError", "ServerStatus"]


class StackConfig(BaseSettings):
    """`LPX_STACK_*` settings. Ports default to free ones, chosen once and kept in stack.json."""

    model_config = SettingsConfigDict(env_prefix="LPX_STACK_", extra="ignore")

    dir: Path = Field(default_factory=stack_dir)
    nats_port: int = 0
    nats_monitor_port: int = 0
    postgres_port: int = 0
    s3_port: int = 0
    bucket: str = "loraplex-adapters"
    start_timeout_s: float = 60.0
    # 1: one nats-server; 3: a JetStream cluster on loopback (streams and buckets R3).
    nats_nodes: int = Field(1, ge=1, le=5)
    # JetStream sync_interval ("always", "default" or a duration like "10s"); "" = always on one node,
    # the NATS default on a cluster (R3 covers a node's crash there).
    nats_sync: str = ""

    def requested_ports(self) -> dict[str, int]:
        wanted = {
            "nats": self.nats_port,
            "nats_monitor": self.nats_monitor_port,
            "postgres": self.postgres_port,
            "s3": self.s3_port,
        }
        return {name: port for name, port in wanted.items() if port}


@dataclass
class ServerStatus:
    name: str
    pid: int | None
    running: bool
    healthy: bool
    endpoint: str
    log: Path


@dataclass
class _State:
    ports: dict[str, int]
    secrets: dict[str, str]
    bucket: str
    pids: dict[str, int] = field(default_factory=dict)
    dirs: dict[str, str] = field(default_factory=dict)
    nats_nodes: int = 1
    nats_sync: str = ""

    @classmethod
    def fresh(cls, config: StackConfig) -> _State:
        names = [n for group in port_names(config.nats_nodes).values() for n in group]
        ports = dict(zip(names, procs.free_ports(len(names)), strict=True))
        ports.update(config.requested_ports())
        creds = {
            "pg_password": secrets.token_urlsafe(18),
            "s3_access_key": "lpx" + secrets.token_hex(8),
            "s3_secret_key": secrets.token_urlsafe(24),
            **nats_secrets(),
        }
        dirs = {"postgres": str(postgres_dir(config.dir.expanduser().resolve()))}
        return cls(
            ports=ports,
            secrets=creds,
            bucket=config.bucket,
            dirs=dirs,
            nats_nodes=config.nats_nodes,
            nats_sync=config.nats_sync,
        )


class Stack:
    def __init__(self, config: StackConfig | None = None) -> None:
        self.config = config or StackConfig()
        self.dir = self.config.dir.expanduser().resolve()
        self.state_file = self.dir / "stack.json"
        self.env_file = self.dir / "stack.env"

    # --- public API ----------------------------------------------------------------------------
    def up(self, on_event: Callable[[str], None] = lambda msg: None) -> dict[str, str]:
        """Start whatever is not running, wait until all are healthy, write the env file.
        Returns the client settings (also written to `stack.env`)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with self._lock():
            state = self._load_state() or _State.fresh(self.config)
            if state.nats_nodes != self.config.nats_nodes and "nats_nodes" in self.config.model_fields_set:
                raise StackError(
                    f"this stack was created with {state.nats_nodes} NATS node(s), not "
                    f"{self.config.nats_nodes}: `lpx stack down --purge` first to change it"
                )
            state.ports.update(self.config.requested_ports())
            servers = self._servers(state)
            started: list[Server] = []
            try:
                for server in servers:
                    if procs.is_ours(state.pids.get(server.name), server.executable) and server.healthy():
                        on_event(f"{server.name}: already running (pid {state.pids[server.name]})")
                        continue
                    self._start(server, state)
                    started.append(server)
                    on_event(f"{server.name}: started (pid {state.pids[server.name]}), log {server.log_path}")
                self._wait_healthy(servers, state, on_event)
                for server in servers:
                    server.after_healthy()
                self._ensure_streams(state)
            except BaseException:
                # Interrupted or failed: leave nothing running that this call started.
                for server in reversed(started):
                    self._stop(server, state)
                self._save_state(state)
                raise
            env = self._client_env(servers)
            self._write_env(env)
            return env

    def status(self) -> list[ServerStatus]:
        state = self._load_state()
        if state is None:
            return []
        result = []
        for server in self._servers(state):
            pid = state.pids.get(server.name)
            running = procs.is_ours(pid, server.executable)
            result.append(
                ServerStatus(
                    server.name,
                    pid if running else None,
                    running,
                    running and server.healthy(),
                    _mask(server.endpoint()),
                    server.log_path,
                )
            )
        return result

    def down(self, on_event: Callable[[str], None] = lambda msg: None) -> None:
        """Stop every server this stack started. Data stays (a later `up` reuses it)."""
        state = self._load_state()
        if state is None:
            return
        with self._lock():
            for server in reversed(self._servers(state)):
                pid = state.pids.get(server.name)
                if pid:
                    self._stop(server, state)
                    on_event(f"{server.name}: stopped (pid {pid})")
            self._save_state(state)
            self.env_file.unlink(missing_ok=True)

    def kill_server(self, name: str, sig: int = 9) -> int | None:
        """SIGKILL one server (chaos drills): no clean shutdown. A later `up` restarts it on the same
        ports and data. Returns the pid it killed."""
        state = self._load_state()
        pid = state.pids.get(name) if state else None
        if not pid:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        procs.wait_until(lambda: not process_alive(pid), 10)
        for server in self._servers(state):
            if server.name == name:
                server.after_stop()  # e.g. weed's leftover sockets, which would block its restart
        return pid

    def servers(self) -> list[Server]:
        state = self._load_state()
        return self._servers(state) if state else []

    def stop_server(self, name: str) -> None:
        """Stop one server (failure drills in tests); a later `up` restarts it on the same ports/data."""
        state = self._load_state()
        if state is None:
            return
        with self._lock():
            for server in self._servers(state):
                if server.name == name:
                    self._stop(server, state)
            self._save_state(state)

    def purge(self) -> None:
        """Stop everything and delete the state dir (data included)."""
        import shutil

        state = self._load_state()
        self.down()
        for path in state.dirs.values() if state else ():
            shutil.rmtree(path, ignore_errors=True)
            if Path(path).parent.name.startswith("loraplex-stack-"):
                shutil.rmtree(Path(path).parent, ignore_errors=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    # --- internals -----------------------------------------------------------------------------
    def _servers(self, state: _State) -> list[Server]:
        ctx = ServerContext(
            self.dir, state.ports, state.secrets, state.bucket, state.dirs, state.nats_nodes, state.nats_sync
        )
        nats_nodes: list[Server] = [NatsServer(ctx, i) for i in range(state.nats_nodes)]
        return [*nats_nodes, PostgresServer(ctx), S3Server(ctx)]

    def _start(self, server: Server, state: _State) -> None:
        server.prepare()
        with open(server.log_path, "ab") as logf:
            proc = subprocess.Popen(
                server.command(),
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=server.env(),
                user=server.run_as(),
                start_new_session=True,
                cwd=server.dir,
            )
        state.pids[server.name] = proc.pid
        self._save_state(state)  # recorded before anything else can go wrong

    def _stop(self, server: Server, state: _State) -> None:
        pid = state.pids.pop(server.name, None)
        if pid and procs.is_ours(pid, server.executable):
            procs.terminate(pid, server.stop_signal)
        server.after_stop()

    def _wait_healthy(self, servers: list[Server], state: _State, on_event) -> None:
        deadline = time.monotonic() + self.config.start_timeout_s
        pending = {s.name: s for s in servers}
        while pending:
            for name, server in list(pending.items()):
                if not procs.is_ours(state.pids.get(name), server.executable):
                    tail = _tail(server.log_path)
                    raise StackError(f"{name} exited during start-up; see {server.log_path}:\n{tail}")
                if server.healthy():
                    on_event(f"{name}: healthy at {_mask(server.endpoint())}")
                    del pending[name]
            if pending and time.monotonic() > deadline:
                names = ", ".join(pending)
                raise StackError(f"not healthy after {self.config.start_timeout_s:.0f}s: {names}")
            time.sleep(0.1)

    def _ensure_streams(self, state: _State) -> None:
        import asyncio
        import threading

        from libs.bus.provision import ensure_streams

        # A thread of its own, so `up` also works when called from inside a running event loop.
        failure: list[BaseException] = []

        servers = [s for s in self._servers(state) if isinstance(s, NatsServer)]
        urls = ",".join(s.endpoint() for s in servers)
        replicas = min(state.nats_nodes, 3)

        async def until_ready() -> None:
            # A cluster answers JetStream requests only once it has elected a meta leader.
            deadline = time.monotonic() + self.config.start_timeout_s
            while True:
                try:
                    await ensure_streams(urls, STREAMS, replicas=replicas, auth=admin_auth(state.secrets))
                    return
                except Exception:
                    if time.monotonic() > deadline or state.nats_nodes == 1:
                        raise
                    await asyncio.sleep(0.5)

        def provision() -> None:
            try:
                asyncio.run(until_ready())
            except BaseException as exc:
                failure.append(exc)

        thread = threading.Thread(target=provision, name="lpx-stack-streams")
        thread.start()
        thread.join()
        if failure:
            raise StackError(f"could not provision JetStream streams: {failure[0]}") from failure[0]

    def _client_env(self, servers: list[Server]) -> dict[str, str]:
        env: dict[str, str] = {}
        for server in servers:
            env.update(server.client_env())
        return env

    def _write_env(self, env: dict[str, str]) -> None:
        body = "# written by `lpx stack up`; removed by `lpx stack down`\n"
        body += "".join(f"{key}={value}\n" for key, value in env.items())
        tmp = self.env_file.with_suffix(".tmp")
        tmp.write_text(body)
        os.chmod(tmp, 0o600)
        tmp.replace(self.env_file)

    def _load_state(self) -> _State | None:
        if not self.state_file.exists():
            return None
        state = _State(**json.loads(self.state_file.read_text()))
        # A stack made before NATS authorization: its users get passwords now (kept from here on).
        state.secrets = {**nats_secrets(), **state.secrets}
        return state

    def _save_state(self, state: _State) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state.__dict__, indent=2))
        os.chmod(tmp, 0o600)
        tmp.replace(self.state_file)

    @contextmanager
    def _lock(self) -> Iterator[None]:
        with open(self.dir / ".lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A killed child of ours stays a zombie until reaped; that counts as gone.
    with contextlib.suppress(Exception):
        import psutil

        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    return True


def _mask(endpoint: str) -> str:
    """Hide the password in a DSN for display."""
    return re.sub(r"(://[^:/@]+:)[^@]+@", r"\1***@", endpoint)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
