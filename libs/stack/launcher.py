"""Start, inspect and stop the local stack.

State lives in one directory (default `$LPX_HOME/stack`): `stack.json` (ports, generated credentials,
pids), `stack.env` (what clients read), and one sub-directory per server with its data and log.
Every pid is recorded the moment its process starts, so `down` can clean up even after `up` was
killed with SIGKILL; an `up` interrupted by a signal stops what it started before exiting.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from libs.stack import procs
from libs.stack.procs import process_alive  # importable from here as before (tests/e2e/up)
from libs.stack.provision import provision_streams
from libs.stack.servers import (
    NatsServer,
    PostgresServer,
    S3Server,
    Server,
    ServerContext,
    StackError,
)
from libs.stack.state import ServerStatus, StackConfig, StackState, write_env

log = logging.getLogger(__name__)

__all__ = ["Stack", "StackConfig", "StackError", "ServerStatus"]


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
            state = self._load_state() or StackState.fresh(self.config)
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
                    procs.mask(server.endpoint()),
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
    def _servers(self, state: StackState) -> list[Server]:
        ctx = ServerContext(
            self.dir, state.ports, state.secrets, state.bucket, state.dirs, state.nats_nodes, state.nats_sync
        )
        nats_nodes: list[Server] = [NatsServer(ctx, i) for i in range(state.nats_nodes)]
        return [*nats_nodes, PostgresServer(ctx), S3Server(ctx)]

    def _start(self, server: Server, state: StackState) -> None:
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

    def _stop(self, server: Server, state: StackState) -> None:
        pid = state.pids.pop(server.name, None)
        if pid and procs.is_ours(pid, server.executable):
            procs.terminate(pid, server.stop_signal)
        server.after_stop()

    def _wait_healthy(self, servers: list[Server], state: StackState, on_event) -> None:
        deadline = time.monotonic() + self.config.start_timeout_s
        pending = {s.name: s for s in servers}
        while pending:
            for name, server in list(pending.items()):
                if not procs.is_ours(state.pids.get(name), server.executable):
                    tail = procs.tail(server.log_path)
                    raise StackError(f"{name} exited during start-up; see {server.log_path}:\n{tail}")
                if server.healthy():
                    on_event(f"{name}: healthy at {procs.mask(server.endpoint())}")
                    del pending[name]
            if pending and time.monotonic() > deadline:
                names = ", ".join(pending)
                raise StackError(f"not healthy after {self.config.start_timeout_s:.0f}s: {names}")
            time.sleep(0.1)

    def _ensure_streams(self, state: StackState) -> None:
        urls = ",".join(s.endpoint() for s in self._servers(state) if isinstance(s, NatsServer))
        provision_streams(urls, state.nats_nodes, state.secrets, self.config.start_timeout_s)

    def _client_env(self, servers: list[Server]) -> dict[str, str]:
        env: dict[str, str] = {}
        for server in servers:
            env.update(server.client_env())
        return env

    def _write_env(self, env: dict[str, str]) -> None:
        write_env(self.env_file, env)

    def _load_state(self) -> StackState | None:
        return StackState.load(self.state_file)

    def _save_state(self, state: StackState) -> None:
        state.save(self.state_file)

    @contextmanager
    def _lock(self) -> Iterator[None]:
        with open(self.dir / ".lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
